//! The `kiln` binary's library part: what its integration tests reach besides the binary itself.

pub mod backends;
