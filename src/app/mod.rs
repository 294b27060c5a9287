//! What the binaries run beside serving: their shared start-up (`cli`), `smol-mcp doctor`
//! (`doctor`), and the report `smol-spec diff` prints (`spec_diff`).

pub mod cli;
pub mod doctor;
pub mod spec_diff;
