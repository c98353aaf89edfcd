//! How the block layouts lay out a drive: the GPT label of the partition layout (`gpt`)
//! and the md arrays of the stripe layout (`md`).

pub mod gpt;
pub mod md;
