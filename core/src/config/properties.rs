//! The `.properties` format Connect's standalone mode reads (`java.util.Properties`):
//! `key=value`, `key: value` or `key value`; `#` and `!` comment lines; a line ending in an
//! odd number of backslashes continues on the next line (whose leading blanks are dropped);
//! escapes `\t \n \r \f \uXXXX`, and a backslash before any other character keeps that
//! character (`\=`, `\:`, `\ `, `\\`).
//!
//! The text is UTF-8. (Java reads these files as ISO-8859-1, so files written for Connect
//! keep non-ASCII characters as `\uXXXX` escapes, which this parser decodes the same way.)

use std::collections::BTreeMap;

use crate::config::ConfigMap;
use crate::error::ConfigError;

/// Parsed properties in file order, each with the line it started on (for later messages).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Properties {
    entries: Vec<Property>,
}

/// One `key=value` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    pub key: String,
    pub value: String,
    /// 1-based line where the entry starts.
    pub line: usize,
}

impl Properties {
    pub fn entries(&self) -> &[Property] {
        &self.entries
    }

    /// The entries as a map; a key set twice keeps its last value, as Java does.
    pub fn to_map(&self) -> ConfigMap {
        self.entries
            .iter()
            .map(|p| (p.key.clone(), p.value.clone()))
            .collect::<BTreeMap<_, _>>()
    }

    /// The line of the entry that sets `key` (the last one if set twice).
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.entries
            .iter()
            .rev()
            .find(|p| p.key == key)
            .map(|p| p.line)
    }
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\x0c')
}

/// Parses properties text; an error names the line of the entry at fault.
pub fn parse_properties(text: &str) -> Result<Properties, ConfigError> {
    let mut entries = Vec::new();
    let mut lines = natural_lines(text).into_iter().peekable();
    while let Some((line_no, line)) = lines.next() {
        let trimmed = line.trim_start_matches(is_blank);
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
            continue;
        }
        let mut logical = trimmed.to_owned();
        while ends_with_odd_backslashes(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start_matches(is_blank)),
                None => break,
            }
        }
        let (raw_key, raw_value) = split_key_value(&logical);
        let key = unescape(raw_key).map_err(|message| ConfigError::Syntax {
            line: line_no,
            message: format!("{message} in key '{raw_key}'"),
        })?;
        let value = unescape(raw_value).map_err(|message| ConfigError::Syntax {
            line: line_no,
            message: format!("{message} in the value of '{key}'"),
        })?;
        entries.push(Property {
            key,
            value,
            line: line_no,
        });
    }
    Ok(Properties { entries })
}

/// Lines split on `\n`, `\r\n` or `\r`, numbered from 1.
fn natural_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            b'\r' => {
                out.push(&text[start..i]);
                if bytes.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out.into_iter()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .collect()
}

fn ends_with_odd_backslashes(line: &str) -> bool {
    line.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1
}

/// Splits at the first unescaped `=`, `:` or blank; blanks around one separator are dropped.
fn split_key_value(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut key_end = line.len();
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' || is_blank(c) {
            key_end = i;
            break;
        }
    }
    let key = &line[..key_end];
    let mut rest = line[key_end..].trim_start_matches(is_blank);
    if let Some(after) = rest.strip_prefix(['=', ':']) {
        rest = after.trim_start_matches(is_blank);
    }
    (key, rest)
}

fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = (hex.len() == 4)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .and_then(char::from_u32)
                    .ok_or_else(|| {
                        format!(
                            "malformed unicode escape '\\u{hex}' (expected \\u and 4 hex digits)"
                        )
                    })?;
                out.push(code);
            }
            Some(other) => out.push(other),
            // A lone trailing backslash (end of file after a continuation) is dropped.
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(text: &str) -> ConfigMap {
        parse_properties(text).expect("valid properties").to_map()
    }

    #[test]
    fn equals_colon_and_blank_all_separate_key_from_value() {
        let m = map("a=1\nb: 2\nc 3\nd   =   4\ne\n");
        assert_eq!(m["a"], "1");
        assert_eq!(m["b"], "2");
        assert_eq!(m["c"], "3");
        assert_eq!(m["d"], "4");
        assert_eq!(m["e"], "");
    }

    #[test]
    fn comment_and_blank_lines_are_skipped() {
        let m = map("# comment\n  ! also a comment\n\n   \nname=file-sink\n");
        assert_eq!(m.len(), 1);
        assert_eq!(m["name"], "file-sink");
    }

    #[test]
    fn a_trailing_backslash_continues_the_value_on_the_next_line() {
        let m = map("topics=a,\\\n     b,\\\n\tc\nnext=1");
        assert_eq!(m["topics"], "a,b,c");
        assert_eq!(m["next"], "1");
    }

    #[test]
    fn an_even_number_of_trailing_backslashes_is_an_escaped_backslash() {
        let m = map("path=C:\\\\\nother=x");
        assert_eq!(m["path"], "C:\\");
        assert_eq!(m["other"], "x");
    }

    #[test]
    fn escapes_in_keys_and_values_are_decoded() {
        let m = map("my\\ key\\=x=tab\\there\\u00e9\\:\\#");
        assert_eq!(m["my key=x"], "tab\there\u{e9}:#");
    }

    #[test]
    fn values_keep_inner_and_trailing_text_after_the_separator() {
        let m = map("regex=(.*)-(\\\\d+) \nquoted = a = b");
        assert_eq!(m["regex"], "(.*)-(\\d+) ");
        assert_eq!(m["quoted"], "a = b");
    }

    #[test]
    fn windows_and_old_mac_line_endings_are_lines_too() {
        let m = map("a=1\r\nb=2\rc=3");
        assert_eq!(
            (m["a"].as_str(), m["b"].as_str(), m["c"].as_str()),
            ("1", "2", "3")
        );
    }

    #[test]
    fn a_key_set_twice_keeps_the_last_value_and_its_line() {
        let props = parse_properties("a=1\nb=2\na=3\n").expect("valid");
        assert_eq!(props.to_map()["a"], "3");
        assert_eq!(props.line_of("a"), Some(3));
        assert_eq!(props.entries().len(), 3);
    }

    #[test]
    fn a_malformed_unicode_escape_is_reported_with_its_line() {
        let err = parse_properties("ok=1\n# c\nbad=\\u12G4\n").expect_err("bad escape");
        assert_eq!(
            err.to_string(),
            "line 3: malformed unicode escape '\\u12G4' (expected \\u and 4 hex digits) in the value of 'bad'"
        );
    }

    #[test]
    fn a_comment_line_does_not_continue_even_with_a_trailing_backslash() {
        let m = map("# comment \\\nkey=v");
        assert_eq!(m["key"], "v");
    }
}
