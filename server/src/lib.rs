//! The `spillway` command's library half: the subcommands that run a worker, so the binary's
//! `main.rs` stays a thin clap front end and tests can call them.

pub mod demo;
pub mod distributed;
pub mod distributed_config;
pub mod herder;
pub mod log_levels;
pub mod metrics;
pub mod mirror;
pub mod rest;
pub mod secrets;
pub mod signals;
pub mod standalone;
pub mod telemetry;
pub mod tenants;
pub mod worker_cmd;
