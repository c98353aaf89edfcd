//! The JSON dialect cufile.json is written in: comments and trailing commas allowed.

use super::{malformed, ParseError};

/// Removes `//` and `/* */` comments outside strings (paths and URLs in strings keep their
/// `//`) and trailing commas before `}` / `]`. Newlines are kept so JSON errors report the
/// operator's line numbers.
pub fn strip_json_comments(text: &str) -> Result<String, ParseError> {
    let out = strip_comments(text.as_bytes())?;
    let res = drop_trailing_commas(&out);
    // Only whole ASCII bytes were removed, so UTF-8 stays valid.
    String::from_utf8(res).map_err(|e| ParseError::Json(e.to_string()))
}

/// First pass: the text without comments (a block comment becomes a space; its newlines stay).
fn strip_comments(b: &[u8]) -> Result<Vec<u8>, ParseError> {
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            i = copy_string(b, i, &mut line, &mut out)?;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i = skip_block_comment(b, i, &mut line, &mut out)?;
        } else {
            if c == b'\n' {
                line += 1;
            }
            out.push(c);
            i += 1;
        }
    }
    Ok(out)
}

/// Copies the string literal that opens at `b[i]` (escapes included); the index after it.
fn copy_string(
    b: &[u8],
    mut i: usize,
    line: &mut usize,
    out: &mut Vec<u8>,
) -> Result<usize, ParseError> {
    let start_line = *line;
    out.push(b'"');
    i += 1;
    loop {
        match b.get(i) {
            None => return Err(malformed(start_line, "unterminated string")),
            Some(b'\\') => {
                out.push(b'\\');
                if let Some(&n) = b.get(i + 1) {
                    out.push(n);
                }
                i += 2;
            }
            Some(b'"') => {
                out.push(b'"');
                return Ok(i + 1);
            }
            Some(&o) => {
                if o == b'\n' {
                    *line += 1;
                }
                out.push(o);
                i += 1;
            }
        }
    }
}

/// Skips the `/* */` comment that opens at `b[i]`, keeping its newlines; the index after it.
fn skip_block_comment(
    b: &[u8],
    mut i: usize,
    line: &mut usize,
    out: &mut Vec<u8>,
) -> Result<usize, ParseError> {
    let start_line = *line;
    i += 2;
    loop {
        match b.get(i) {
            None => return Err(malformed(start_line, "unterminated /* comment")),
            Some(b'*') if b.get(i + 1) == Some(&b'/') => {
                out.push(b' ');
                return Ok(i + 2);
            }
            Some(b'\n') => {
                *line += 1;
                out.push(b'\n');
                i += 1;
            }
            Some(_) => i += 1,
        }
    }
}

/// Second pass: drop commas followed only by whitespace and a closing bracket.
fn drop_trailing_commas(out: &[u8]) -> Vec<u8> {
    let mut res: Vec<u8> = Vec::with_capacity(out.len());
    let mut in_str = false;
    let mut j = 0;
    while j < out.len() {
        let c = out[j];
        if in_str {
            res.push(c);
            if c == b'\\' {
                if let Some(&n) = out.get(j + 1) {
                    res.push(n);
                }
                j += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
        } else if c == b'"' {
            in_str = true;
            res.push(c);
        } else if c == b',' {
            let next = out[j + 1..].iter().find(|x| !x.is_ascii_whitespace());
            if !matches!(next, Some(b'}') | Some(b']')) {
                res.push(c);
            }
        } else {
            res.push(c);
        }
        j += 1;
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn json_comments_respect_strings() {
        let t = r#"{
  // a comment with "quotes"
  "logging": { "dir": "/var/log//gds", /* inline */ "url": "http://x/y" },
  /* multi
     line */
  "properties": { "allow_compat_mode": false, }, // trailing comma
  "s": "a \" // not a comment",
}"#;
        let s = strip_json_comments(t).unwrap();
        let v: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["logging"]["dir"], "/var/log//gds");
        assert_eq!(v["logging"]["url"], "http://x/y");
        assert_eq!(v["s"], "a \" // not a comment");
        assert!(strip_json_comments("{ /* open").is_err());
        assert!(strip_json_comments("{ \"open").is_err());
    }

    /// An error names the line its string or comment opened on, counting the newlines
    /// of code, strings and comments alike.
    #[test]
    fn errors_name_the_line_it_opened_on() {
        let line = |t: &str| match strip_json_comments(t) {
            Err(ParseError::Malformed { line, .. }) => line,
            other => panic!("{t:?}: {other:?}"),
        };
        assert_eq!(line("{\n\n  \"a\": 1, /* open"), 3);
        assert_eq!(
            line("{\n \"a\": \"x\ny\", /* two\nlines */\n \"b\": \"open"),
            5
        );
    }

    /// A comment may open the file and hold a `*`; only `/*` opens one, so a stray `*`
    /// stays where the operator wrote it (and the JSON error points at it).
    #[test]
    fn comments_end_only_at_star_slash_and_open_only_at_slash_star() {
        assert_eq!(strip_json_comments("/* head */{}").unwrap(), " {}");
        assert_eq!(
            strip_json_comments("{\"a\": 1 /* 2 * 3 */}").unwrap(),
            "{\"a\": 1  }"
        );
        assert_eq!(strip_json_comments("[1 */ 2]").unwrap(), "[1 */ 2]");
    }

    /// A comma and a bracket inside a string are text, not a trailing comma; a `//`
    /// comment may end the file without a newline.
    #[test]
    fn commas_in_strings_stay_and_a_comment_may_end_the_file() {
        let v =
            |t: &str| -> Value { serde_json::from_str(&strip_json_comments(t).unwrap()).unwrap() };
        let got = v(r#"{"a": "x,}", "b": "q\",]", "c": [1,],}"#);
        assert_eq!(got["a"], "x,}");
        assert_eq!(got["b"], "q\",]");
        assert_eq!(got["c"], serde_json::json!([1]));
        assert_eq!(v("{\"a\": 1} // the end")["a"], 1);
    }
}
