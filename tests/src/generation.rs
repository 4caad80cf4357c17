//! Generation on a compiled device runs a fixed set of programs: the fixture's greedy
//! continuation on `xla` equals Hugging Face's, compiling one program for the prompt's bucket and
//! one for every decoding step; a second prompt of another length in the same bucket, decoding
//! further, compiles nothing new.

use burn_trainium::{TrainiumDevice, reset_stats};
use hlat::generate::{GenerationOptions, Sampling, generate};

use test_support::fixtures::{expected, fixture, token_ids};

use crate::support::{programs, trainium, xla};

#[test]
fn greedy_generation_on_xla_compiles_a_fixed_set_of_programs() {
    xla();
    // A device of its own: no other test compiles on it, so its statistics count only this one.
    let xla = TrainiumDevice::xla(3);
    let device = trainium(xla);
    let expected = expected("hf-tiny-llama");
    let (config, model) = hlat::hf::import_hf(
        &fixture("hf-tiny-llama"),
        &device,
        hlat::hf::WeightDtype::F32,
    )
    .unwrap();
    // The import's own operations run before generation starts.
    device.sync().unwrap();
    let prompt = token_ids(&expected["greedy_prompt"]);
    let continuation = token_ids(&expected["greedy_continuation"]);
    let options = |max_new_tokens| GenerationOptions {
        max_new_tokens,
        sampling: Sampling::Greedy,
        seed: 0,
        stop_ids: vec![config.eos_token_id],
    };

    reset_stats(&xla);
    let generated = generate(&model, &prompt, &options(continuation.len()), |_| {}).unwrap();
    assert_eq!(generated, continuation);
    device.sync().unwrap();
    let first = programs(&xla);
    assert_eq!(
        first,
        2,
        "{} tokens: one program for the prompt's bucket, one for every decoding step",
        continuation.len()
    );

    // Another prompt length in the same bucket, more tokens: the same programs.
    let longer: Vec<u32> = prompt.iter().chain(&prompt[..2]).copied().collect();
    assert_eq!(
        hlat::generate::prompt_bucket(longer.len(), config.max_seq_len),
        hlat::generate::prompt_bucket(prompt.len(), config.max_seq_len)
    );
    let more = (config.max_seq_len - longer.len()).min(3 * continuation.len());
    generate(&model, &longer, &options(more), |_| {}).unwrap();
    device.sync().unwrap();
    assert_eq!(programs(&xla), first, "no new program");
}
