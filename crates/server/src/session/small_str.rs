//! A string kept inline when it is short, as most a connection keeps for
//! its life are (a subscription id, its `Host` header): no block of its
//! own on the heap for each (a block costs its bytes rounded up, plus the
//! allocator's header, and pins the page it sits on).

/// Bytes kept inline (the type is 24 bytes, as a `String`).
const INLINE: usize = 22;

/// A string: inline up to [`INLINE`] bytes, else boxed.
#[derive(Clone)]
pub(super) enum SmallStr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Boxed(Box<str>),
}

impl SmallStr {
    pub(super) fn new(s: &str) -> SmallStr {
        match u8::try_from(s.len()) {
            Ok(len) if s.len() <= INLINE => {
                let mut bytes = [0u8; INLINE];
                bytes[..s.len()].copy_from_slice(s.as_bytes());
                SmallStr::Inline { len, bytes }
            }
            _ => SmallStr::Boxed(s.into()),
        }
    }

    pub(super) fn as_str(&self) -> &str {
        match self {
            // The bytes are a whole `str` (`new`), so this never falls back.
            SmallStr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            SmallStr::Boxed(s) => s,
        }
    }
}

impl From<String> for SmallStr {
    fn from(s: String) -> SmallStr {
        if s.len() <= INLINE {
            SmallStr::new(&s)
        } else {
            SmallStr::Boxed(s.into_boxed_str())
        }
    }
}

impl PartialEq<str> for SmallStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_inline_and_every_string_reads_back() {
        assert_eq!(std::mem::size_of::<SmallStr>(), 24);
        for s in [
            "",
            "a",
            "idle",
            "relay.example.com:443",
            "é".repeat(11).as_str(),
        ] {
            let small = SmallStr::new(s);
            assert!(matches!(small, SmallStr::Inline { .. }), "{s}");
            assert_eq!(small.as_str(), s);
            assert_eq!(SmallStr::from(s.to_owned()).as_str(), s);
        }
        for s in ["x".repeat(23), "é".repeat(12), "y".repeat(300)] {
            let small = SmallStr::from(s.clone());
            assert!(matches!(small, SmallStr::Boxed(_)), "{s}");
            assert_eq!(small.as_str(), s);
            assert!(small == *s.as_str());
        }
    }
}
