//! Text into HTML: everything an operator or a client provides goes through
//! [`escape`] before it is part of a page.

use std::fmt::Write;

/// `s` with `& < > " '` escaped: safe as element text and as a quoted
/// attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Appends `<dt>term</dt><dd>value</dd>` (both escaped).
pub fn push_pair(out: &mut String, term: &str, value: &str) {
    let _ = write!(out, "<dt>{}</dt><dd>{}</dd>", escape(term), escape(value));
}

/// Bytes in words: `128 KiB`, `1.5 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A duration in seconds in words: `15 minutes`, `30 days`.
pub fn duration(secs: u64) -> String {
    let plural = |n: u64, unit: &str| {
        if n == 1 {
            format!("1 {unit}")
        } else {
            format!("{n} {unit}s")
        }
    };
    match secs {
        s if s >= 86_400 && s % 86_400 == 0 => plural(s / 86_400, "day"),
        s if s >= 3_600 && s % 3_600 == 0 => plural(s / 3_600, "hour"),
        s if s >= 60 && s % 60 == 0 => plural(s / 60, "minute"),
        s => plural(s, "second"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            escape(r#"<script>alert("x" + 'y')</script> & co"#),
            "&lt;script&gt;alert(&quot;x&quot; + &#39;y&#39;)&lt;/script&gt; &amp; co"
        );
    }

    #[test]
    fn sizes_and_durations_read_as_words() {
        assert_eq!(bytes(512), "512 bytes");
        assert_eq!(bytes(128 * 1024), "128 KiB");
        assert_eq!(bytes(1536 << 20), "1.5 GiB");
        assert_eq!(duration(900), "15 minutes");
        assert_eq!(duration(2_592_000), "30 days");
        assert_eq!(duration(3_600), "1 hour");
        assert_eq!(duration(61), "61 seconds");
    }
}
