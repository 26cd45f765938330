//! Row scans in f64: the reference of `examples::cumsum_rows`.

/// The inclusive prefix sums of each of the rows of `cols` values of `x`
/// (row-major), summed in order.
pub fn cumsum_rows(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols.max(1))
        .flat_map(|row| {
            row.iter().scan(0.0, |s, &v| {
                *s += v;
                Some(*s)
            })
        })
        .collect()
}
