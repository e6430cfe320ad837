//! Atomics and cells that are `loom`'s under `cfg(loom)` and std's otherwise.
//!
//! The cross-core protocols (slot claim, wakeup word, idle gate, the
//! synchronization primitives) are written once against these names, so the
//! loom models check the very code that runs in production.

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
};

pub(crate) use std::sync::atomic::Ordering;

/// A hint inside a spin loop; under loom it lets the model run other threads.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::hint::spin_loop();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// An `UnsafeCell` with loom's closure-based access API.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
    #[cfg(not(loom))] std::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Wraps `value`.
    #[cfg(loom)]
    pub(crate) fn new(value: T) -> Self {
        Self(loom::cell::UnsafeCell::new(value))
    }

    /// The contents.
    #[inline]
    pub(crate) fn into_inner(self) -> T {
        self.0.into_inner()
    }

    /// Calls `f` with a shared raw pointer to the contents.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(loom)]
        return self.0.with(f);
        #[cfg(not(loom))]
        f(self.0.get())
    }

    /// Calls `f` with a mutable raw pointer to the contents.
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(loom)]
        return self.0.with_mut(f);
        #[cfg(not(loom))]
        f(self.0.get())
    }
}

/// A checked mutable pointer into an [`UnsafeCell`] (loom tracks its use).
#[cfg(loom)]
pub(crate) type MutPtr<T> = loom::cell::MutPtr<T>;

/// A mutable pointer into an [`UnsafeCell`].
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct MutPtr<T: ?Sized>(*mut T);

#[cfg(not(loom))]
impl<T: ?Sized> MutPtr<T> {
    /// The pointee.
    ///
    /// # Safety
    /// The caller guarantees exclusive access for the reference's lifetime.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn deref(&self) -> &mut T {
        // SAFETY: per the function's contract.
        unsafe { &mut *self.0 }
    }
}

impl<T> UnsafeCell<T> {
    /// A pointer for a guard that hands out references.
    #[inline]
    pub(crate) fn get_mut(&self) -> MutPtr<T> {
        #[cfg(loom)]
        return self.0.get_mut();
        #[cfg(not(loom))]
        MutPtr(self.0.get())
    }
}

/// A checked shared pointer into an [`UnsafeCell`] (loom tracks its use).
#[cfg(loom)]
pub(crate) type ConstPtr<T> = loom::cell::ConstPtr<T>;

/// A shared pointer into an [`UnsafeCell`].
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct ConstPtr<T: ?Sized>(*const T);

#[cfg(not(loom))]
impl<T: ?Sized> ConstPtr<T> {
    /// The pointee.
    ///
    /// # Safety
    /// The caller guarantees that nothing writes it for the reference's
    /// lifetime.
    pub(crate) unsafe fn deref(&self) -> &T {
        // SAFETY: per the function's contract.
        unsafe { &*self.0 }
    }
}

impl<T> UnsafeCell<T> {
    /// A pointer for a guard that hands out shared references (a read
    /// lock's).
    #[inline]
    pub(crate) fn get(&self) -> ConstPtr<T> {
        #[cfg(loom)]
        return self.0.get();
        #[cfg(not(loom))]
        ConstPtr(self.0.get())
    }
}
