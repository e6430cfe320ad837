//! corewise: core-aware user-level threads (under construction).
