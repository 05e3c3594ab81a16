//! One module per subcommand.

pub mod completions;
pub mod config;
pub mod db;
pub mod export;
pub mod hist;
pub mod history;
pub mod incidents;
pub mod man;
pub mod pwru;
pub mod replay;
pub mod run;
pub mod samples;
pub mod shared;
pub mod simulate;
pub mod status;
pub mod tune;
