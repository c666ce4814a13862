//! Little-endian primitives shared by the object and image formats: a writer
//! and a bounds-checked reader whose errors carry the byte offset.

use crate::FormatError;

/// Longest name the formats accept; a larger length field means corruption.
pub(crate) const MAX_NAME_BYTES: usize = 4096;

#[derive(Default)]
pub(crate) struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.bytes.extend_from_slice(s.as_bytes());
    }
    pub fn blob(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.bytes.extend_from_slice(b);
    }
}

pub(crate) struct Reader<'a> {
    pub what: &'static str,
    pub bytes: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Reader {
            what,
            bytes,
            pos: 0,
        }
    }

    pub fn err(&self, at: usize, message: impl Into<String>) -> FormatError {
        FormatError::at(self.what, at, message)
    }

    pub fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], FormatError> {
        let remaining = self.bytes.len() - self.pos;
        if n > remaining {
            return Err(self.err(
                self.pos,
                format!("truncated: {field} needs {n} bytes, only {remaining} remain"),
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, field: &str) -> Result<u8, FormatError> {
        Ok(self.take(1, field)?[0])
    }

    pub fn u32(&mut self, field: &str) -> Result<u32, FormatError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i64(&mut self, field: &str) -> Result<i64, FormatError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    pub fn str(&mut self, field: &str) -> Result<String, FormatError> {
        let at = self.pos;
        let n = self.u32(field)? as usize;
        if n > MAX_NAME_BYTES {
            return Err(self.err(at, format!("{field} length {n} exceeds {MAX_NAME_BYTES}")));
        }
        let b = self.take(n, field)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err(at + 4, format!("{field} is not UTF-8")))
    }

    pub fn blob(&mut self, field: &str) -> Result<&'a [u8], FormatError> {
        let n = self.u32(field)? as usize;
        self.take(n, field)
    }

    /// A count field whose entries need at least `min_entry_bytes` each; a
    /// count the remaining input cannot hold is rejected before any
    /// allocation so that corrupt counts never allocate huge vectors.
    pub fn count(&mut self, field: &str, min_entry_bytes: usize) -> Result<usize, FormatError> {
        let at = self.pos;
        let n = self.u32(field)? as usize;
        let remaining = self.bytes.len() - self.pos;
        if n.saturating_mul(min_entry_bytes) > remaining {
            return Err(self.err(
                at,
                format!("{field} = {n} cannot fit in the remaining {remaining} bytes"),
            ));
        }
        Ok(n)
    }

    pub fn finish(&self) -> Result<(), FormatError> {
        if self.pos != self.bytes.len() {
            return Err(self.err(
                self.pos,
                format!(
                    "{} trailing bytes after the end",
                    self.bytes.len() - self.pos
                ),
            ));
        }
        Ok(())
    }
}
