//! Tests of the `exitless` command line and of the documents that must
//! agree with the code: each module drives the binary or reads docs/. One
//! test binary (see README, Tests).

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod cli_tools;
mod determinism;
mod docs;
mod input_bounds;
mod newcomer;
mod sensitivity;
