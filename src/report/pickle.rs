//! A Python pickle writer (protocol 2) for the few types a PyTorch memory snapshot holds:
//! dicts, lists, 2-tuples, strings, integers, booleans and None.
//!
//! Only opcodes that both Python's `pickle` and the unpickler of PyTorch's memory_viz
//! viewer (`torch/utils/viz/MemoryViz.js`) read are written: PROTO, EMPTY_DICT, EMPTY_LIST,
//! MARK, SETITEMS, APPENDS, TUPLE2, BININT1, BININT2, BININT, LONG1 (at most 8 bytes),
//! BINUNICODE, LONG_BINPUT, LONG_BINGET, NEWTRUE, NEWFALSE, NONE and STOP. Strings and
//! marked objects are memoized, so a snapshot's thousands of repeated keys, action names and
//! frame lists cost five bytes each after the first.

use std::collections::HashMap;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const TUPLE2: u8 = 0x86;
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const LONG_BINPUT: u8 = b'r';
const LONG_BINGET: u8 = b'j';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const NONE: u8 = b'N';

/// A memoized object: [`Pickler::get`] pushes it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memo(u32);

/// Writes one pickled object into a byte vector. Containers are opened and closed around
/// their items (`dict_begin` ... `dict_end`), keys and values alternating in a dict.
#[derive(Debug, Default)]
pub struct Pickler {
    out: Vec<u8>,
    strings: HashMap<String, Memo>,
    next_memo: u32,
}

impl Pickler {
    pub fn new() -> Self {
        let mut p = Pickler::default();
        p.out.extend_from_slice(&[PROTO, 2]);
        p
    }

    /// The pickle, closed with STOP.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(STOP);
        self.out
    }

    pub fn dict_begin(&mut self) {
        self.out.extend_from_slice(&[EMPTY_DICT, MARK]);
    }

    pub fn dict_end(&mut self) {
        self.out.push(SETITEMS);
    }

    pub fn list_begin(&mut self) {
        self.out.extend_from_slice(&[EMPTY_LIST, MARK]);
    }

    pub fn list_end(&mut self) {
        self.out.push(APPENDS);
    }

    /// Makes a tuple of the two objects written last.
    pub fn tuple2(&mut self) {
        self.out.push(TUPLE2);
    }

    pub fn int(&mut self, v: i64) {
        if (0..=0xff).contains(&v) {
            self.out.extend_from_slice(&[BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.out.push(BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if let Ok(w) = i32::try_from(v) {
            self.out.push(BININT);
            self.out.extend_from_slice(&w.to_le_bytes());
        } else {
            // The shortest two's-complement little-endian form.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let (top, below) = (bytes[n - 1], bytes[n - 2]);
                let redundant = (top == 0 && below < 0x80) || (top == 0xff && below >= 0x80);
                if !redundant {
                    break;
                }
                n -= 1;
            }
            self.out.extend_from_slice(&[LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    /// An unsigned count or address (addresses and sizes of a device stay far below 2^63).
    pub fn uint(&mut self, v: u64) {
        self.int(i64::try_from(v).unwrap_or(i64::MAX));
    }

    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { NEWTRUE } else { NEWFALSE });
    }

    pub fn none(&mut self) {
        self.out.push(NONE);
    }

    /// A string, written once and fetched from the memo after that.
    pub fn str(&mut self, s: &str) {
        if let Some(&m) = self.strings.get(s) {
            self.get(m);
            return;
        }
        self.out.push(BINUNICODE);
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        let m = self.put();
        self.strings.insert(s.to_string(), m);
    }

    /// Memoizes the object on top of the stack (a container just closed, say).
    pub fn put(&mut self) -> Memo {
        let m = Memo(self.next_memo);
        self.next_memo += 1;
        self.out.push(LONG_BINPUT);
        self.out.extend_from_slice(&m.0.to_le_bytes());
        m
    }

    /// Pushes a memoized object again (the same object, not a copy).
    pub fn get(&mut self, m: Memo) {
        self.out.push(LONG_BINGET);
        self.out.extend_from_slice(&m.0.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_take_the_shortest_opcode() {
        let enc = |v: i64| {
            let mut p = Pickler::new();
            p.int(v);
            p.finish()[2..].to_vec()
        };
        assert_eq!(enc(7), vec![BININT1, 7, STOP]);
        assert_eq!(enc(300), vec![BININT2, 0x2c, 0x01, STOP]);
        assert_eq!(enc(-1), vec![BININT, 0xff, 0xff, 0xff, 0xff, STOP]);
        assert_eq!(enc(1 << 31), vec![LONG1, 5, 0, 0, 0, 0x80, 0, STOP]);
        assert_eq!(enc(1 << 40), vec![LONG1, 6, 0, 0, 0, 0, 0, 1, STOP]);
        assert_eq!(enc(-(1 << 40)), vec![LONG1, 6, 0, 0, 0, 0, 0, 0xff, STOP]);
    }

    #[test]
    fn repeated_strings_come_from_the_memo() {
        let mut p = Pickler::new();
        p.list_begin();
        p.str("alloc");
        p.str("alloc");
        p.list_end();
        let b = p.finish();
        assert_eq!(b.iter().filter(|&&c| c == BINUNICODE).count(), 1);
        assert_eq!(b.iter().filter(|&&c| c == LONG_BINGET).count(), 1);
    }
}
