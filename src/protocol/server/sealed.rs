//! The `requestState` this server hands a 2026-07-28 client with an input-required result
//! (MRTR): sealed with a key random per process (a question outlives no process: a restarted
//! server simply asks again), and bound to the call it was asked for, so that an answer given
//! for one call cannot be replayed into another.

use rmcp::model::RequestStateCodec;
use std::sync::OnceLock;

pub fn codec() -> &'static RequestStateCodec {
    static CODEC: OnceLock<RequestStateCodec> = OnceLock::new();
    CODEC.get_or_init(|| RequestStateCodec::new_unchecked(rand::random::<[u8; 32]>().to_vec()))
}

/// What a sealed state is bound to: the tool and the arguments it was called with.
pub fn bound_to(tool: &str, args: &rmcp::model::JsonObject) -> Vec<u8> {
    serde_json::to_vec(&(tool, args)).unwrap_or_default()
}
