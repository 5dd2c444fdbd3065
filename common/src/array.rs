//! Array specifications as `sbatch --array` writes them: `0-99%8`, `1,3,5-7`,
//! `0-15:4%2` (indices, ranges, ranges with a step, and a limit on how many run at
//! once). The CLI reads one to refuse early; allotd reads it again to decide.

/// Most elements one array may have (Slurm's `MaxArraySize` defaults to 1,001).
pub const MAX_ELEMENTS: usize = 10_000;

/// The largest index an array may use.
pub const MAX_INDEX: u32 = 9_999_999;

/// An array: its indices, ascending and each once, and its limit (0: none); what
/// allotd journals with the submission.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArraySpec {
    /// Indices, ascending, each once.
    pub indices: Vec<u32>,
    /// At most this many elements run (or wait in the queue) at once; 0: no limit.
    #[serde(default)]
    pub limit: u32,
}

/// Reads `--array`; the error names the part that is wrong and the shape to use.
pub fn parse(s: &str) -> Result<ArraySpec, String> {
    let shape =
        "write indices and ranges as 0-99, 1,3,5-7 or 0-15:4, with %N to run at most N at once";
    let s = s.trim();
    let (list, limit) = match s.split_once('%') {
        Some((l, n)) => {
            let n: u32 = n
                .trim()
                .parse()
                .map_err(|_| format!("array: {n:?} after % is not a number; {shape}"))?;
            if n == 0 {
                return Err(format!("array: %0 would run nothing; {shape}"));
            }
            (l, n)
        }
        None => (s, 0),
    };
    if list.trim().is_empty() {
        return Err(format!("array: no indices; {shape}"));
    }
    let num = |t: &str| -> Result<u32, String> {
        let v: u32 = t
            .trim()
            .parse()
            .map_err(|_| format!("array: {t:?} is not an index; {shape}"))?;
        if v > MAX_INDEX {
            return Err(format!("array: index {v} is over {MAX_INDEX}"));
        }
        Ok(v)
    };
    let mut indices = std::collections::BTreeSet::new();
    for part in list.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((r, st)) => (r, num(st)?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("array: step 0 in {part:?}; {shape}"));
        }
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let v = num(range)?;
                (v, v)
            }
        };
        if lo > hi {
            return Err(format!("array: {range:?} runs backwards; {shape}"));
        }
        let mut i = lo;
        while i <= hi {
            indices.insert(i);
            if indices.len() > MAX_ELEMENTS {
                return Err(format!(
                    "array: more than {MAX_ELEMENTS} elements; split it into several arrays"
                ));
            }
            match i.checked_add(step) {
                Some(n) => i = n,
                None => break,
            }
        }
    }
    Ok(ArraySpec {
        indices: indices.into_iter().collect(),
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_sbatch_reads() {
        let a = parse("0-99%8").unwrap();
        assert_eq!((a.indices.len(), a.limit), (100, 8));
        assert_eq!(parse("1,3,5-7").unwrap().indices, vec![1, 3, 5, 6, 7]);
        assert_eq!(parse("0-15:4").unwrap().indices, vec![0, 4, 8, 12]);
        assert_eq!(parse("3,3,1").unwrap().indices, vec![1, 3]);
        for bad in [
            "", "%4", "5-1", "a", "0-9%0", "0-9:0", "0-20000", "99999999",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.starts_with("array: "), "{bad}: {e}");
        }
    }
}
