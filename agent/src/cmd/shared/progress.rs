//! Progress bars of the long commands (`replay`, `tune`, `simulate`) on stderr.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps (a spinner when the length is unknown) drawn with `template`,
/// hidden when stderr is not a terminal so that logs and pipes get no bar.
pub fn bar(len: Option<u64>, template: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    // The templates are constants: a bad one still shows a plain bar rather than failing.
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}
