//! Finds a NaN or an infinity anywhere in a report before it is written. JSON has no such
//! numbers (serde_json writes them as `null`, which reads as "not applicable"), and the text
//! report would print `NaN`: either way a reader would take a broken figure for a real one.
//! A serializer that visits every field and keeps the path to the first bad float is the one
//! check that covers every figure, including those added later.

use serde::ser::{self, Serialize};

/// The dotted path (`throughput.mfu`, `steps[1].time_s`) of the first float in `value` that
/// is not finite, or None.
pub fn first_non_finite<T: Serialize + ?Sized>(value: &T) -> Option<String> {
    let mut v = Visitor { path: Vec::new(), found: None };
    // The visitor's only error is the stop it raises at the first bad float.
    let _ = value.serialize(&mut v);
    v.found
}

struct Visitor {
    path: Vec<String>,
    found: Option<String>,
}

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a float that is not finite")
    }
}

impl std::error::Error for Stop {}

impl ser::Error for Stop {
    fn custom<M: std::fmt::Display>(_: M) -> Stop {
        Stop
    }
}

impl Visitor {
    fn float(&mut self, x: f64) -> Result<(), Stop> {
        if x.is_finite() {
            return Ok(());
        }
        let mut p = String::new();
        for part in &self.path {
            if !p.is_empty() && !part.starts_with('[') {
                p.push('.');
            }
            p.push_str(part);
        }
        self.found = Some(format!("{} = {x}", if p.is_empty() { "(the value)" } else { &p }));
        Err(Stop)
    }

    fn nested<T: Serialize + ?Sized>(&mut self, part: String, value: &T) -> Result<(), Stop> {
        self.path.push(part);
        let r = value.serialize(&mut *self);
        self.path.pop();
        r
    }
}

/// Sequences, tuples and maps: each element under its index (a map's under its key).
struct Items<'a> {
    v: &'a mut Visitor,
    index: usize,
    key: Option<String>,
}

impl Items<'_> {
    fn next<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        let part = self.key.take().unwrap_or_else(|| format!("[{}]", self.index));
        self.index += 1;
        self.v.nested(part, value)
    }
}

macro_rules! items {
    ($($trait:ident $method:ident),*) => {$(
        impl ser::$trait for Items<'_> {
            type Ok = ();
            type Error = Stop;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
                self.next(value)
            }
            fn end(self) -> Result<(), Stop> {
                Ok(())
            }
        }
    )*};
}
items!(SerializeSeq serialize_element, SerializeTuple serialize_element, SerializeTupleStruct serialize_field, SerializeTupleVariant serialize_field);

impl ser::SerializeMap for Items<'_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Stop> {
        // Keys are names (strings in every report map); anything else gets its index.
        self.key = serde_json::to_value(key).ok().and_then(|k| k.as_str().map(str::to_string));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.next(value)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

/// Structs and struct variants: each field under its name.
macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Items<'_> {
            type Ok = ();
            type Error = Stop;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Stop> {
                self.v.nested(key.to_string(), value)
            }
            fn end(self) -> Result<(), Stop> {
                Ok(())
            }
        }
    )*};
}
fields!(SerializeStruct, SerializeStructVariant);

macro_rules! ignore {
    ($($method:ident: $t:ty),*) => {$(
        fn $method(self, _: $t) -> Result<(), Stop> {
            Ok(())
        }
    )*};
}

impl<'a> ser::Serializer for &'a mut Visitor {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Items<'a>;
    type SerializeTuple = Items<'a>;
    type SerializeTupleStruct = Items<'a>;
    type SerializeTupleVariant = Items<'a>;
    type SerializeMap = Items<'a>;
    type SerializeStruct = Items<'a>;
    type SerializeStructVariant = Items<'a>;

    ignore!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64,
        serialize_u128: u128, serialize_char: char, serialize_str: &str, serialize_bytes: &[u8],
        serialize_unit_struct: &'static str);

    fn serialize_f32(self, x: f32) -> Result<(), Stop> {
        self.float(f64::from(x))
    }
    fn serialize_f64(self, x: f64) -> Result<(), Stop> {
        self.float(x)
    }
    fn serialize_none(self) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        self.nested(variant.to_string(), value)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
    fn serialize_tuple(self, _: usize) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Items<'a>, Stop> {
        Ok(Items { v: self, index: 0, key: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Step {
        time_s: f64,
    }

    #[derive(serde::Serialize)]
    struct R {
        name: String,
        steps: Vec<Step>,
        extra: Option<std::collections::BTreeMap<String, f64>>,
        json: serde_json::Value,
    }

    #[test]
    fn names_the_first_float_that_is_not_finite() {
        let mut r = R {
            name: "x".into(),
            steps: vec![Step { time_s: 1.0 }, Step { time_s: 2.0 }],
            extra: None,
            json: serde_json::json!({"a": [1.5, {"b": 2}]}),
        };
        assert_eq!(first_non_finite(&r), None);
        r.steps[1].time_s = f64::NAN;
        assert_eq!(first_non_finite(&r).as_deref(), Some("steps[1].time_s = NaN"));
        r.steps[1].time_s = 2.0;
        r.extra = Some([("mfu".to_string(), f64::INFINITY)].into());
        assert_eq!(first_non_finite(&r).as_deref(), Some("extra.mfu = inf"));
        assert_eq!(first_non_finite(&f64::NEG_INFINITY).as_deref(), Some("(the value) = -inf"));
    }
}
