//! Source files and byte spans.
//!
//! Every syntax node carries a [`Span`] (file id plus byte range) so that any
//! diagnostic can name `file:line:col` and underline the offending text. The
//! [`SourceMap`] owns the texts; nothing else in the crate keeps a copy.
//!
//! Turning an offset into `line:col` costs a binary search over the line
//! starts and a count of at most `2 * CHAR_MARK_BYTES` bytes, however long
//! the line: a file that is one 50 MB line with thousands of diagnostics
//! must not count its characters once per diagnostic.

use serde::Serialize;

/// Index of a file in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
pub struct FileId(pub u32);

/// A byte range `[start, end)` in one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Span {
        Span { file, start: start as u32, end: end.max(start) as u32 }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span { file: self.file, start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// The same range shifted by `offset` bytes (used when a line is parsed on its own).
    pub fn shifted(self, offset: u32) -> Span {
        Span { file: self.file, start: self.start + offset, end: self.end + offset }
    }
}

/// Distance in bytes between two entries of [`SourceFile`]'s character
/// counts: the most bytes one column lookup counts.
pub const CHAR_MARK_BYTES: usize = 1024;

/// One source file: a display name and its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
    line_starts: Vec<u32>,
    /// Entry `k` is the number of characters in the first
    /// `k * CHAR_MARK_BYTES` bytes of `text`.
    chars_before_mark: Vec<u32>,
}

/// Whether `b` starts a character (is not a UTF-8 continuation byte).
fn starts_char(b: u8) -> bool {
    b & 0xC0 != 0x80
}

impl SourceFile {
    fn new(name: String, text: String) -> SourceFile {
        let mut line_starts = vec![0];
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                line_starts.push(i as u32 + 1);
            }
        }
        let mut chars_before_mark = vec![0];
        let mut chars = 0u32;
        for block in text.as_bytes().chunks(CHAR_MARK_BYTES) {
            chars += block.iter().filter(|b| starts_char(**b)).count() as u32;
            chars_before_mark.push(chars);
        }
        SourceFile { name, text, line_starts, chars_before_mark }
    }

    /// Number of characters before byte `offset`, which is at most the
    /// text's length and on a character boundary.
    fn chars_before(&self, offset: usize) -> usize {
        let mark = offset / CHAR_MARK_BYTES;
        let counted = self.text.as_bytes()[mark * CHAR_MARK_BYTES..offset].iter().filter(|b| starts_char(**b)).count();
        self.chars_before_mark[mark] as usize + counted
    }

    /// 1-based line and column (column counted in characters) of a byte offset.
    pub fn line_col(&self, offset: u32) -> (usize, usize) {
        let offset = offset.min(self.text.len() as u32);
        let line = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[line] as usize;
        let end = (offset as usize).max(start);
        // Off a character boundary there are no characters to count: the
        // column is then in bytes.
        let col = if !(self.text.is_char_boundary(start) && self.text.is_char_boundary(end)) {
            end - start
        } else if end - start <= CHAR_MARK_BYTES {
            self.text[start..end].chars().count()
        } else {
            self.chars_before(end) - self.chars_before(start)
        };
        (line + 1, col + 1)
    }

    /// The text of 1-based line `line`, without its newline.
    pub fn line_text(&self, line: usize) -> &str {
        let start = self.line_starts[line - 1] as usize;
        let end = self.line_starts.get(line).map(|&e| e as usize).unwrap_or(self.text.len());
        self.text[start..end].trim_end_matches(['\n', '\r'])
    }

    /// Byte offset at which 1-based line `line` starts.
    pub fn line_start(&self, line: usize) -> u32 {
        self.line_starts[line - 1]
    }

    pub fn line_count(&self) -> usize {
        self.line_starts.len()
    }
}

/// All source files of one compilation.
#[derive(Debug, Default, Clone)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        self.files.push(SourceFile::new(name.into(), text.into()));
        FileId(self.files.len() as u32 - 1)
    }

    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn snippet(&self, span: Span) -> &str {
        let text = &self.file(span.file).text;
        text.get(span.start as usize..span.end as usize).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `line_col` as it was: the characters from the line's start, counted
    /// each time. The oracle for the counts kept every `CHAR_MARK_BYTES`.
    fn line_col_by_counting(text: &str, offset: usize) -> (usize, usize) {
        let offset = offset.min(text.len());
        let start = text[..floor(text, offset)].rfind('\n').map_or(0, |i| i + 1);
        let line = text[..start].matches('\n').count() + 1;
        let col = text.get(start..offset).map(|s| s.chars().count()).unwrap_or(offset - start);
        (line, col + 1)
    }

    fn floor(text: &str, mut i: usize) -> usize {
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    }

    proptest! {
        /// Long lines of one- and two-byte characters, with a few line
        /// breaks, at every offset (on a character boundary or not).
        #[test]
        fn columns_are_counted_characters(
            parts in prop::collection::vec(("[aé]{0,3000}", any::<bool>()), 1..4),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 64),
        ) {
            let text: String = parts.iter().map(|(s, nl)| if *nl { format!("{s}\n") } else { s.clone() }).collect();
            let file = SourceFile::new("t".into(), text.clone());
            for pick in picks {
                let offset = pick.index(text.len() + 2);
                prop_assert_eq!(file.line_col(offset as u32), line_col_by_counting(&text, offset), "at {}", offset);
            }
        }
    }
}
