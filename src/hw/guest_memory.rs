//! A VM's guest-physical memory as real bytes, for the pages a shared-memory
//! protocol lives in (vCanal's channel, later virtio rings).
//!
//! The VM's RAM spans guest-physical `[0, ram_size)`; only one window of it,
//! `[base, base + len)`, is backed by bytes here (the rest of RAM — the
//! buffers a zero-copy call points at — is modelled elsewhere, but host code
//! still needs to know whether a guest pointer lies inside RAM, which is
//! [`GuestMemory::check_ram`]). Fields are little-endian, as on x86.
//!
//! The guest may write anything into these bytes, so every access is
//! bounds-checked and returns a [`MemError`]; nothing here panics on a
//! guest-chosen address or length.

/// A guest-physical access that cannot be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// `gpa + len` overflows the 64-bit address space.
    #[error("guest range {gpa:#x}+{len:#x} overflows")]
    Overflow {
        /// Start of the range.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// The range is not inside guest RAM.
    #[error("guest range {gpa:#x}+{len:#x} is outside guest RAM")]
    OutsideRam {
        /// Start of the range.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// The range is inside RAM but not in the backed window.
    #[error("guest range {gpa:#x}+{len:#x} is not backed")]
    NotBacked {
        /// Start of the range.
        gpa: u64,
        /// Its length.
        len: u64,
    },
}

/// Guest RAM `[0, ram_size)` with the window `[base, base + len)` backed by
/// bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestMemory {
    ram_size: u64,
    base: u64,
    bytes: Vec<u8>,
}

/// End of `[gpa, gpa + len)`, or [`MemError::Overflow`].
fn range_end(gpa: u64, len: u64) -> Result<u64, MemError> {
    gpa.checked_add(len).ok_or(MemError::Overflow { gpa, len })
}

impl GuestMemory {
    /// RAM of `ram_size` bytes with `len` bytes backed from `base`, zeroed.
    /// The window must lie inside RAM.
    pub fn new(ram_size: u64, base: u64, len: usize) -> Result<Self, MemError> {
        let l = len as u64;
        if range_end(base, l)? > ram_size {
            return Err(MemError::OutsideRam { gpa: base, len: l });
        }
        Ok(Self {
            ram_size,
            base,
            bytes: vec![0; len],
        })
    }

    /// Size of guest RAM in bytes.
    pub fn ram_size(&self) -> u64 {
        self.ram_size
    }

    /// The backed window: (base GPA, length).
    pub fn window(&self) -> (u64, u64) {
        (self.base, self.bytes.len() as u64)
    }

    /// The backed bytes, for tests that play a hostile guest.
    pub fn window_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Checks that `[gpa, gpa + len)` lies inside guest RAM (an empty range
    /// at `ram_size` does).
    pub fn check_ram(&self, gpa: u64, len: u64) -> Result<(), MemError> {
        if range_end(gpa, len)? > self.ram_size {
            return Err(MemError::OutsideRam { gpa, len });
        }
        Ok(())
    }

    /// Checks that `[gpa, gpa + len)` is backed here.
    pub fn check_backed(&self, gpa: u64, len: u64) -> Result<(), MemError> {
        self.window_range(gpa, len).map(|_| ())
    }

    /// The byte range of the window holding `[gpa, gpa + len)`.
    fn window_range(&self, gpa: u64, len: u64) -> Result<std::ops::Range<usize>, MemError> {
        self.check_ram(gpa, len)?;
        let end = gpa + len; // checked by check_ram
        let wend = self.base + self.bytes.len() as u64;
        if gpa < self.base || end > wend {
            return Err(MemError::NotBacked { gpa, len });
        }
        let off = (gpa - self.base) as usize;
        Ok(off..off + len as usize)
    }

    /// Copies guest memory at `gpa` into `out`.
    pub fn read(&self, gpa: u64, out: &mut [u8]) -> Result<(), MemError> {
        let r = self.window_range(gpa, out.len() as u64)?;
        out.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    /// Copies `data` into guest memory at `gpa`.
    pub fn write(&mut self, gpa: u64, data: &[u8]) -> Result<(), MemError> {
        let r = self.window_range(gpa, data.len() as u64)?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }

    /// Fills `[gpa, gpa + len)` with `byte`.
    pub fn fill(&mut self, gpa: u64, len: u64, byte: u8) -> Result<(), MemError> {
        let r = self.window_range(gpa, len)?;
        self.bytes[r].fill(byte);
        Ok(())
    }

    /// Reads `N` bytes at `gpa`.
    fn read_array<const N: usize>(&self, gpa: u64) -> Result<[u8; N], MemError> {
        let mut b = [0; N];
        self.read(gpa, &mut b)?;
        Ok(b)
    }

    /// Little-endian u16 at `gpa`.
    pub fn read_u16(&self, gpa: u64) -> Result<u16, MemError> {
        self.read_array(gpa).map(u16::from_le_bytes)
    }

    /// Little-endian u32 at `gpa`.
    pub fn read_u32(&self, gpa: u64) -> Result<u32, MemError> {
        self.read_array(gpa).map(u32::from_le_bytes)
    }

    /// Little-endian u64 at `gpa`.
    pub fn read_u64(&self, gpa: u64) -> Result<u64, MemError> {
        self.read_array(gpa).map(u64::from_le_bytes)
    }

    /// Writes a little-endian u16 at `gpa`.
    pub fn write_u16(&mut self, gpa: u64, v: u16) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }

    /// Writes a little-endian u32 at `gpa`.
    pub fn write_u32(&mut self, gpa: u64, v: u32) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }

    /// Writes a little-endian u64 at `gpa`.
    pub fn write_u64(&mut self, gpa: u64, v: u64) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }

    /// `lock cmpxchg` on the u64 at `gpa`: if it holds `current`, store
    /// `new` and return `Ok(current)`; otherwise return `Err(actual)`.
    /// (One simulated step is atomic, so this is the whole instruction.)
    pub fn compare_exchange_u64(
        &mut self,
        gpa: u64,
        current: u64,
        new: u64,
    ) -> Result<Result<u64, u64>, MemError> {
        let actual = self.read_u64(gpa)?;
        if actual != current {
            return Ok(Err(actual));
        }
        self.write_u64(gpa, new)?;
        Ok(Ok(current))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fields_are_little_endian_and_round_trip() {
        let mut m = GuestMemory::new(1 << 20, 0x1000, 64).unwrap();
        m.write_u64(0x1008, 0x1122_3344_5566_7788).unwrap();
        let mut b = [0u8; 8];
        m.read(0x1008, &mut b).unwrap();
        assert_eq!(b, [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(m.read_u32(0x1008).unwrap(), 0x5566_7788);
        assert_eq!(m.read_u16(0x100e).unwrap(), 0x1122);
        m.write_u16(0x1000, 0xbeef).unwrap();
        m.write_u32(0x1002, 0xdead_f00d).unwrap();
        assert_eq!(m.read_u16(0x1000).unwrap(), 0xbeef);
        assert_eq!(m.read_u32(0x1002).unwrap(), 0xdead_f00d);
    }

    #[test]
    fn out_of_window_and_out_of_ram_accesses_are_errors() {
        let mut m = GuestMemory::new(0x10000, 0x1000, 0x100).unwrap();
        // Last u64 of the window is fine; one byte further is not.
        assert!(m.read_u64(0x10f8).is_ok());
        assert_eq!(
            m.read_u64(0x10f9),
            Err(MemError::NotBacked {
                gpa: 0x10f9,
                len: 8
            })
        );
        assert_eq!(
            m.write_u32(0xffc, 1),
            Err(MemError::NotBacked { gpa: 0xffc, len: 4 })
        );
        assert_eq!(
            m.read_u64(0x10000),
            Err(MemError::OutsideRam {
                gpa: 0x10000,
                len: 8
            })
        );
        assert_eq!(
            m.read_u64(u64::MAX - 3),
            Err(MemError::Overflow {
                gpa: u64::MAX - 3,
                len: 8
            })
        );
        assert!(m.check_ram(0, 0x10000).is_ok());
        assert!(m.check_ram(0x10000, 0).is_ok());
        assert!(m.check_ram(0xffff, 2).is_err());
        assert!(m.check_ram(1, u64::MAX).is_err());
        assert!(GuestMemory::new(0x1000, 0xf00, 0x200).is_err());
    }

    #[test]
    fn compare_exchange_stores_only_on_match() {
        let mut m = GuestMemory::new(0x2000, 0, 0x2000).unwrap();
        m.write_u64(0x40, 5).unwrap();
        assert_eq!(m.compare_exchange_u64(0x40, 4, 9).unwrap(), Err(5));
        assert_eq!(m.read_u64(0x40).unwrap(), 5);
        assert_eq!(m.compare_exchange_u64(0x40, 5, 9).unwrap(), Ok(5));
        assert_eq!(m.read_u64(0x40).unwrap(), 9);
    }

    proptest! {
        /// Any address and length: an access either succeeds inside the
        /// window or returns an error; it never panics.
        #[test]
        fn any_access_is_checked(gpa in any::<u64>(), len in 0usize..64, near in any::<bool>()) {
            let mut m = GuestMemory::new(0x4000, 0x1000, 0x1000).unwrap();
            let gpa = if near { 0xf00 + gpa % 0x300 } else { gpa };
            let mut buf = vec![0u8; len];
            let ok = m.read(gpa, &mut buf).is_ok();
            prop_assert_eq!(ok, gpa >= 0x1000 && gpa.checked_add(len as u64).is_some_and(|e| e <= 0x2000));
            prop_assert_eq!(m.write(gpa, &buf).is_ok(), ok);
        }
    }
}
