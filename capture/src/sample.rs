//! Slow-SKB sample records (being built).
