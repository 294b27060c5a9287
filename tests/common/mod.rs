#![allow(dead_code)]

pub mod real_serve;
