#![allow(dead_code)]

pub mod fake_cloud;
pub mod fake_serve;
pub mod real_serve;
