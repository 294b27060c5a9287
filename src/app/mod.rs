//! What the binaries run beside serving: their shared command line and runtime (`cli`), the
//! start, the wait for a stop and the exit both servers share (`serve`), `smol-mcp doctor`
//! (`doctor`, its report rendered for a person), and the report `smol-spec diff` prints
//! (`spec_diff`).

pub mod cli;
pub mod doctor;
pub mod serve;
pub mod spec_diff;
