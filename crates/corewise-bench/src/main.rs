//! corewise-bench (under construction).
fn main() {}
