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
    release: Option<Release>,
}

/// How an owner hands back the resident pages of a range of its bytes (offsets into the owner)
/// without changing any byte: see [`SharedBytes::release_pages`].
pub type Release = Arc<dyn Fn(Range<usize>) + Send + Sync>;

impl SharedBytes {
    /// The whole of `owner`.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        SharedBytes {
            owner,
            range: 0..len,
            release: None,
        }
    }

    /// The whole of `owner`, whose resident pages `release` can hand back (see
    /// [`SharedBytes::release_pages`]). `release` must leave every byte of the owner as it was:
    /// a later read of a released page sees the same bytes (read again from the file behind
    /// them), only the memory they take is given back meanwhile.
    pub fn with_release(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, release: Release) -> Self {
        SharedBytes {
            release: Some(release),
            ..Self::new(owner)
        }
    }

    /// Asks the owner to hand back the memory pages that lie wholly inside this view: for bytes
    /// that were read once and are now kept elsewhere (a weight copied into another layout), so
    /// that the process does not hold both copies. The bytes stay readable and unchanged (the
    /// pages of a file's bytes are read again on the next access); owners without a way to do
    /// this (owned vectors) ignore it.
    pub fn release_pages(&self) {
        if let Some(release) = &self.release {
            release(self.range.clone());
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
            release: self.release.clone(),
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

    #[test]
    fn release_is_asked_for_the_view_s_range_of_the_owner() {
        use std::sync::Mutex;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        let b = SharedBytes::with_release(
            Arc::new((0u8..100).collect::<Vec<u8>>()),
            Arc::new(move |r| log.lock().unwrap().push(r)),
        );
        b.slice(10..60)
            .unwrap()
            .slice(5..20)
            .unwrap()
            .release_pages();
        b.release_pages();
        assert_eq!(*asked.lock().unwrap(), [15..30, 0..100]);
        // Owned bytes have nothing to release.
        SharedBytes::from_vec(vec![1, 2, 3]).release_pages();
    }
}
