//! The fuzz bodies' byte reader: input turned into bounded choices, zeros
//! once the input runs out (so every input is a whole, finite run).
//! Declared once (`#[path]`) by each crate that includes the bodies: the
//! fuzz targets and `tests/fuzz_replay.rs`.

pub struct Bytes<'a>(pub &'a [u8]);

// Not every body uses every reader.
#[allow(dead_code)]
impl Bytes<'_> {
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.byte();
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
