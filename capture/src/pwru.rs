//! pwru session management (being built).
