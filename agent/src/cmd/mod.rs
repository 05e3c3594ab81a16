//! One module per subcommand.

pub mod db;
pub mod hist;
pub mod replay;
pub mod simulate;
