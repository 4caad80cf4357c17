//! Who may open a session on a served device.

use std::net::SocketAddr;
use std::sync::Arc;

use burn_remote::server::{AuthorizationRequest, ClientId, PeerAuthorizer, TokenAuthorizer};

use super::gate::Peers;
use crate::BackendError;

/// Who a device server lets in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Clients connecting from this machine's loopback addresses, with no secret.
    Loopback,
    /// Clients presenting this shared secret (`RemoteHost::with_credential`), from anywhere.
    Token(String),
}

impl Access {
    /// Checks that `listen` may serve under this access: an address other than loopback needs a
    /// shared secret.
    pub fn check(&self, listen: &SocketAddr) -> Result<(), BackendError> {
        match self {
            Access::Loopback if !listen.ip().is_loopback() => Err(BackendError::Server {
                device: listen.to_string(),
                reason: format!(
                    "listening on {listen}, which is not a loopback address, needs a shared \
                     secret (--token-file)"
                ),
            }),
            Access::Token(token) if token.is_empty() => Err(BackendError::Server {
                device: listen.to_string(),
                reason: "the shared secret is empty".to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The authorizer a `BackendServer` checks every session with; refusals are logged with the
    /// peer's address. Behind a gate, the peer is the client the gate's connection carries (in
    /// `gated`), and a session that did not come through the gate is refused.
    pub(crate) fn authorizer(
        &self,
        gated: Option<Arc<Peers>>,
    ) -> Result<impl PeerAuthorizer + use<>, BackendError> {
        let token = match self {
            Access::Loopback => None,
            Access::Token(token) => {
                Some(
                    TokenAuthorizer::new(token.as_str()).map_err(|_| BackendError::Server {
                        device: String::new(),
                        reason: "the shared secret is empty".to_string(),
                    })?,
                )
            }
        };
        Ok(move |request: AuthorizationRequest<'_>| {
            let client = match (&gated, request.client) {
                (None, client) => Ok(client),
                (Some(peers), ClientId::WebSocket(upstream)) => peers
                    .client_of(&upstream)
                    .map(ClientId::WebSocket)
                    .ok_or_else(|| format!("{upstream} did not come through the server's gate")),
                (Some(_), other) => Err(format!("{other} did not come through the server's gate")),
            };
            let verdict = client.clone().and_then(|client| match &token {
                Some(token) => token.authorize(AuthorizationRequest {
                    client,
                    device_index: request.device_index,
                    credential: request.credential,
                }),
                None => match client {
                    ClientId::WebSocket(address) if address.ip().is_loopback() => Ok(()),
                    other => Err(format!("{other} is not on this machine's loopback")),
                },
            });
            if let Err(reason) = &verdict {
                let client = client.map_or_else(|_| request.client.to_string(), |c| c.to_string());
                log::warn!(
                    "refused a session on device {} from {client}: {reason}",
                    request.device_index,
                );
            }
            verdict
        })
    }
}
