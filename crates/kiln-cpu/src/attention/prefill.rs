//! Prefill: more query rows than one block holds, split into tasks of whole query rows
//! (`super::rows_per_task`), each computing every head of its rows over each vector's whole key
//! range.

use super::flash::attend_keys;
use super::job::{Job, State};
use crate::kernels::{KvElem, BLOCK};
use crate::sgemm::Isa;

/// A prefill task: every head of query rows `[r0, r0 + rows)` into `out` (those rows).
pub(super) fn rows_task<E: KvElem>(
    isa: Isa,
    job: &Job<'_, E>,
    n_kv_heads: usize,
    r0: usize,
    out: &mut [f32],
) {
    let rows = out.len() / job.q_cols;
    let mut st = State::new(BLOCK, job.hd);
    for kvh in 0..n_kv_heads {
        for b in job.blocks(kvh, r0, rows) {
            st.reset();
            attend_keys(isa, job, &b, b.lo..b.hi, false, &mut st);
            for (m, x) in b.queries.iter().enumerate() {
                let at = (x.row - r0) * job.q_cols + x.col;
                let inv = if st.sum[m] > 0.0 {
                    1.0 / st.sum[m]
                } else {
                    0.0
                };
                let acc = &st.acc[m * job.hd..(m + 1) * job.hd];
                for (o, &a) in out[at..at + job.hd].iter_mut().zip(acc) {
                    *o = a * inv;
                }
            }
        }
    }
}
