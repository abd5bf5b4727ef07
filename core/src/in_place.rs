//! Building a struct in its slot at the end of a `Vec`, field by field.
//!
//! `out.push(Record { .. })` of a record-sized struct (about 160 bytes for a raw record, 240
//! for a sink record) builds it on the stack and copies it into the list with a `memcpy`
//! call, whose wide loads read back the narrow stores that just built it: the store buffer
//! cannot forward those, and the load waits for the stores to retire (issue 18: a call and a
//! stall per record at each stage that builds records).
//! [`push_in_place!`](crate::push_in_place) writes each field straight into the list's spare
//! capacity instead.

/// Pushes `Type { field: value, .. }` onto the `Vec<Type>` `out`, each field written where it
/// lies in the new element. Every field must be named (checked at compile time, as a struct
/// expression is); the length grows only once all are written, so a panic in a field's
/// expression leaks the fields written before it and leaves `out` as it was.
///
/// A field left out does not compile:
/// ```compile_fail
/// struct Pair { left: u8, right: u8 }
/// let mut out: Vec<Pair> = Vec::new();
/// spillway_core::push_in_place!(&mut out, Pair { left: 1 });
/// ```
#[macro_export]
macro_rules! push_in_place {
    // A field's value: the expression given, or the variable of its name (`Type { field }`).
    (@value $field:ident : $value:expr) => {
        $value
    };
    (@value $field:ident) => {
        $field
    };
    ($out:expr, $ty:ident { $($field:ident $(: $value:expr)?),+ $(,)? }) => {{
        // A pattern that names every field, never run: a field left out fails to compile
        // here instead of being left uninitialised below.
        #[allow(unused)]
        let every_field_named = |r: &$ty| {
            let $ty { $($field: _),+ } = r;
        };
        let out: &mut ::std::vec::Vec<$ty> = $out;
        out.reserve(1);
        let len = out.len();
        // SAFETY: `reserve` made room for one more element at `len`.
        let slot = unsafe { out.as_mut_ptr().add(len) };
        $(
            // Evaluated outside the `unsafe` blocks: the caller's expressions stay checked.
            let value = $crate::push_in_place!(@value $field $(: $value)?);
            // SAFETY: `slot` is in the spare capacity, which nothing else reaches while `out`
            // is borrowed here.
            unsafe { ::std::ptr::addr_of_mut!((*slot).$field).write(value) };
        )+
        // SAFETY: each field of the new element was written once just above (the pattern
        // names them all, and a name cannot repeat in it).
        unsafe { out.set_len(len + 1) };
    }};
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[derive(Debug, PartialEq)]
    struct Wide {
        name: Arc<str>,
        count: u64,
        parts: Vec<u8>,
        flag: Option<bool>,
    }

    #[test]
    fn pushes_every_field_and_grows_by_one() {
        let mut out: Vec<Wide> = Vec::new();
        for i in 0..100u64 {
            let name: Arc<str> = format!("n{i}").into();
            push_in_place!(
                &mut out,
                Wide {
                    name,
                    count: i,
                    parts: vec![i as u8; i as usize],
                    flag: i.is_multiple_of(2).then_some(true),
                }
            );
        }
        assert_eq!(out.len(), 100);
        for (i, w) in out.iter().enumerate() {
            let i = i as u64;
            let expected = Wide {
                name: format!("n{i}").into(),
                count: i,
                parts: vec![i as u8; i as usize],
                flag: i.is_multiple_of(2).then_some(true),
            };
            assert_eq!(w, &expected);
        }
    }

    fn failing_parts() -> Vec<u8> {
        panic!("a field's expression failed")
    }

    #[test]
    fn a_panic_in_a_field_leaves_the_list_as_it_was() {
        let shared: Arc<str> = "shared".into();
        let mut out: Vec<Wide> = Vec::new();
        push_in_place!(
            &mut out,
            Wide {
                name: Arc::clone(&shared),
                count: 1,
                parts: Vec::new(),
                flag: None,
            }
        );
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            push_in_place!(
                &mut out,
                Wide {
                    name: Arc::clone(&shared),
                    count: 2,
                    parts: failing_parts(),
                    flag: None,
                }
            );
        }));
        assert!(failed.is_err());
        assert_eq!(out.len(), 1, "the half-built element is not in the list");
        assert_eq!(out[0].count, 1);
        out.push(Wide {
            name: Arc::clone(&shared),
            count: 3,
            parts: vec![3],
            flag: Some(false),
        });
        assert_eq!(out[1].count, 3, "the slot is reused whole");
    }
}
