//! Exists so that the package has a library target; the programs are in `main.rs`.
#![no_std]
