"""The one Rust version this workspace builds with (keep rust-toolchain.toml in step)."""

RUST_VERSION = "1.95.0"
