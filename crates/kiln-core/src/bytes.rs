use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// A shared, immutable byte range inside an owner that lives as long as any view of it.
///
/// Invariant: `range` lies inside `owner`'s bytes (checked at construction), so `deref` never
/// goes out of bounds. The owner is usually a memory-mapped file: the map stays alive until the
/// last weight that points into it is dropped.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl SharedBytes {
    /// The whole of `owner`.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        SharedBytes {
            owner,
            range: 0..len,
        }
    }

    /// Owned bytes (tests, synthesized weights).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self::new(Arc::new(bytes))
    }

    /// A sub-range of this view (relative to its start), or `None` when it does not fit.
    pub fn slice(&self, range: Range<usize>) -> Option<SharedBytes> {
        if range.start > range.end || range.end > self.range.len() {
            return None;
        }
        Some(SharedBytes {
            owner: self.owner.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SharedBytes({} bytes at {})",
            self.range.len(),
            self.range.start
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_inside_their_parent() {
        let b = SharedBytes::from_vec((0u8..10).collect());
        let s = b.slice(2..6).unwrap();
        assert_eq!(&*s, &[2, 3, 4, 5]);
        assert_eq!(&*s.slice(1..3).unwrap(), &[3, 4]);
        assert!(s.slice(3..5).is_none());
        assert!(b.slice(9..11).is_none());
    }
}
