//! [`ChatTemplate`]: a tokenizer's `chat_template` (Jinja, from `tokenizer_config.json`)
//! rendered as transformers' `apply_chat_template` renders it: blocks trimmed (`trim_blocks`,
//! `lstrip_blocks`), loop controls, `raise_exception`, `tojson`, Python's string methods, and
//! the variables `messages`, `bos_token`, `eos_token`, `add_generation_prompt`.

use std::path::Path;

use hlat::FileError;
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

/// The name of the tokenizer's configuration file next to `tokenizer.json`.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// What can go wrong reading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template or configuration file could not be read, or `tokenizer_config.json` is not
    /// JSON or has no usable `chat_template`.
    #[error(transparent)]
    File(#[from] FileError),
    /// The template does not compile or failed to render (`raise_exception` included).
    #[error("chat template of {}: {message}", source_name)]
    Render {
        /// Where the template came from.
        source_name: String,
        /// The engine's message.
        message: String,
    },
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text of the message.
    pub content: String,
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source_name: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source_name)
            .finish()
    }
}

/// A special token of `tokenizer_config.json`: a string, or an `AddedToken` object's `content`.
fn token_text(config: &serde_json::Value, name: &str) -> String {
    match config.get(name) {
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(serde_json::Value::Object(token)) => token
            .get("content")
            .and_then(|content| content.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// Compiles `template` (named `source_name` in errors) with the special tokens' texts.
    pub fn new(
        template: &str,
        source_name: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned("chat", template.to_string())
            .map_err(|error| ChatTemplateError::Render {
                source_name: source_name.to_string(),
                message: error.to_string(),
            })?;
        Ok(Self {
            env,
            source_name: source_name.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The `chat_template` of a `tokenizer_config.json` (a string; of a list of named templates,
    /// the one named `default`), with its `bos_token` and `eos_token`. `Ok(None)` when the file
    /// has no template.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>, ChatTemplateError> {
        let text = FileError::read_to_string(path)?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|error| FileError::invalid(path, format!("invalid JSON: {error}")))?;
        let template = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(template)) => template.clone(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|entry| entry.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|entry| entry.get("template"))
                .and_then(|template| template.as_str())
                .map(str::to_string)
                .ok_or_else(|| {
                    FileError::invalid(path, "`chat_template` lists no template named `default`")
                })?,
            Some(other) => {
                return Err(FileError::invalid(
                    path,
                    format!("`chat_template` is neither a string nor a list: {other}"),
                )
                .into());
            }
        };
        Self::new(
            &template,
            &path.display().to_string(),
            &token_text(&config, "bos_token"),
            &token_text(&config, "eos_token"),
        )
        .map(Some)
    }

    /// A template file (`--chat-template FILE`: the Jinja text itself), with the special tokens
    /// of the `tokenizer_config.json` beside the tokenizer when there is one.
    pub fn from_file(
        path: &Path,
        tokenizer_config: Option<&Path>,
    ) -> Result<Self, ChatTemplateError> {
        let template = FileError::read_to_string(path)?;
        let (bos, eos) = match tokenizer_config.filter(|config| config.is_file()) {
            Some(config_path) => {
                let text = FileError::read_to_string(config_path)?;
                let config: serde_json::Value =
                    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
                (
                    token_text(&config, "bos_token"),
                    token_text(&config, "eos_token"),
                )
            }
            None => (String::new(), String::new()),
        };
        Self::new(&template, &path.display().to_string(), &bos, &eos)
    }

    /// The text of `messages`; with `add_generation_prompt`, followed by what opens the
    /// assistant's next turn.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template("chat")
            .expect("added at construction");
        template
            .render(context! {
                messages => Value::from(minijinja::value::Serde(messages)),
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                add_generation_prompt => add_generation_prompt,
            })
            .map_err(|error| ChatTemplateError::Render {
                source_name: self.source_name.clone(),
                message: error.to_string(),
            })
    }
}
