//! Host-side layouts the CUDA kernels take, built from the engine's types.

use anyhow::bail;

use crate::engine::backend::ForwardBatch;

/// Token masks of one step as `apply_token_bitmask` takes them: the constrained sequences'
/// bitsets packed into `[masked rows, words]`, and for each logits row the mask row it uses
/// or -1 (unconstrained, nothing uploaded for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaskRows {
    /// 32-bit words per mask: `ceil(vocab / 32)`.
    pub words: usize,
    /// The packed masks, row-major.
    pub data: Vec<u32>,
    /// Per logits row: the mask row, or -1.
    pub rows: Vec<i32>,
}

impl MaskRows {
    /// Packs one optional mask per logits row for a vocabulary of `vocab` tokens. A mask must
    /// have exactly `ceil(vocab / 32)` words (the plugins' layout): anything else is a bug
    /// upstream, reported rather than read out of bounds on the device.
    pub fn pack(masks: &[Option<&[u32]>], vocab: usize) -> anyhow::Result<Self> {
        let words = vocab.div_ceil(32);
        let mut data = Vec::new();
        let mut rows = Vec::with_capacity(masks.len());
        for (i, m) in masks.iter().enumerate() {
            match m {
                None => rows.push(-1),
                Some(m) if m.len() == words => {
                    rows.push((data.len() / words.max(1)) as i32);
                    data.extend_from_slice(m);
                }
                Some(m) => bail!("mask of row {i} has {} words; a vocabulary of {vocab} needs {words}", m.len()),
            }
        }
        Ok(Self { words, data, rows })
    }
}

/// The block tables of a batch as `paged_attention` takes them: one row of `max_blocks`
/// entries per sequence (padded with 0; never read past a row's last position), and the
/// sequence of each token row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTables {
    /// Entries per table row.
    pub max_blocks: usize,
    /// Row-major `[sequences, max_blocks]`.
    pub tables: Vec<u32>,
    /// Per token row: its sequence's index.
    pub row_seq: Vec<u32>,
}

impl BlockTables {
    /// The tables of `batch`.
    pub fn from_batch(batch: &ForwardBatch) -> Self {
        let max_blocks = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0).max(1);
        let mut tables = vec![0u32; batch.seqs.len() * max_blocks];
        let mut row_seq = vec![0u32; batch.len()];
        for (i, s) in batch.seqs.iter().enumerate() {
            tables[i * max_blocks..i * max_blocks + s.block_table.len()].copy_from_slice(&s.block_table);
            row_seq[s.start..s.start + s.len].fill(i as u32);
        }
        Self { max_blocks, tables, row_seq }
    }
}

/// The batch sizes decode steps are captured as CUDA graphs for (vLLM's choice: 1, 2, 4, then
/// every multiple of 8 up to 256).
pub fn graph_sizes() -> Vec<usize> {
    let mut sizes = vec![1, 2, 4];
    sizes.extend((8..=256).step_by(8));
    sizes
}

/// The captured graph a decode step of `batch` sequences runs in: the smallest captured size
/// at least `batch` (the extra rows are padding), or `None` past the largest (run eagerly).
pub fn graph_bucket(batch: usize, sizes: &[usize]) -> Option<usize> {
    if batch == 0 {
        return None;
    }
    sizes.iter().copied().filter(|&s| s >= batch).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_pack_only_the_constrained_rows() {
        let a = [0b1010u32, 0, 1];
        let b = [u32::MAX, u32::MAX, 0];
        let packed = MaskRows::pack(&[Some(&a), None, Some(&b), None], 70).unwrap();
        assert_eq!(packed.words, 3);
        assert_eq!(packed.rows, vec![0, -1, 1, -1]);
        assert_eq!(packed.data, vec![0b1010, 0, 1, u32::MAX, u32::MAX, 0]);
        let e = MaskRows::pack(&[Some(&a[..2])], 70).unwrap_err();
        assert_eq!(e.to_string(), "mask of row 0 has 2 words; a vocabulary of 70 needs 3");
    }

    #[test]
    fn block_tables_are_padded_and_rows_know_their_sequence() {
        let mut batch = ForwardBatch::default();
        batch.push_sequence(&[1, 2, 3], 0, &[7], 16, true);
        batch.push_sequence(&[4], 40, &[2, 5, 9], 16, true);
        let t = BlockTables::from_batch(&batch);
        assert_eq!(t.max_blocks, 3);
        assert_eq!(t.tables, vec![7, 0, 0, 2, 5, 9]);
        assert_eq!(t.row_seq, vec![0, 0, 0, 1]);
        // The slot the kernel computes from the table equals the batch's slot.
        let (row, pos) = (3usize, batch.positions[3] as usize);
        let seq = t.row_seq[row] as usize;
        let slot = t.tables[seq * t.max_blocks + pos / 16] as usize * 16 + pos % 16;
        assert_eq!(slot as u32, batch.slots[row]);
    }

    #[test]
    fn decode_batches_round_up_to_a_captured_size() {
        let sizes = graph_sizes();
        assert_eq!(sizes[..5], [1, 2, 4, 8, 16]);
        assert_eq!(graph_bucket(1, &sizes), Some(1));
        assert_eq!(graph_bucket(3, &sizes), Some(4));
        assert_eq!(graph_bucket(9, &sizes), Some(16));
        assert_eq!(graph_bucket(64, &sizes), Some(64));
        assert_eq!(graph_bucket(256, &sizes), Some(256));
        assert_eq!(graph_bucket(257, &sizes), None);
        assert_eq!(graph_bucket(0, &sizes), None);
    }
}
