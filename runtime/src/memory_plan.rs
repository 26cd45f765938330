//! The memory plan printed at start: how the device memory (or a CPU budget)
//! splits into model weights, workspace (activations, logits, sampling
//! buffers), a reserve, and the paged KV cache, and what the cache holds.
//!
//! # Arithmetic
//!
//! One token of KV costs `2 (K and V) * n_layers * n_kv_heads * head_dim *
//! dtype_bytes` bytes (an FP8 cache: `2 * n_layers * slot_bytes`, the
//! values, a 4-byte scale per head and a share of its group of slots'
//! padding to 128 bytes; see `kernels::kv_cache`); a block costs
//! `block_size` times that (block sizes are multiples of the FP8 cache's
//! groups). The KV budget is
//! `available - weights - workspace - reserve`, and
//!
//! ```text
//! num_blocks = min(KV budget / bytes_per_block,        (memory)
//!                  (2^31 - 1) / (block_size * n_kv_heads * head_dim),   (32-bit offsets)
//!                  max_blocks if given)                (requested cap)
//! ```
//!
//! The offset cap is the kernels' rule: one layer's cache tensor
//! `[num_blocks, block_size, n_kv, head_dim]` must have fewer than 2^31
//! elements (it also keeps every slot inside i32); an FP8 layer fewer than
//! 2^31 bytes.
//!
//! Invariants of a [`MemoryPlan`] (errors otherwise): weights, workspace,
//! reserve and KV cache together fit in `available`, and the cache holds at
//! least one sequence of `max_model_len` tokens, so the scheduler built from
//! it ([`MemoryPlan::scheduler_config`]) can never livelock on a sequence that
//! does not fit.

use crate::gguf::llama::LlamaConfig;
use crate::kv::{KvError, KvResult, blocks_for};
use crate::scheduler::SchedulerConfig;
use std::fmt;

/// The shape of the KV cache of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Transformer layers (one K and one V cache each).
    pub n_layers: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Bytes per cache element (2 for bf16/f16, 4 for f32); with `fp8`
    /// unused.
    pub dtype_bytes: usize,
    /// An FP8 cache: a token's heads take
    /// [`kernels::kv_cache::slot_bytes`] bytes per layer for K and for V.
    pub fp8: bool,
}

impl KvShape {
    /// The cache shape of a Llama model with elements of `dtype_bytes` bytes.
    pub fn from_llama(config: &LlamaConfig, dtype_bytes: usize) -> KvShape {
        KvShape {
            n_layers: config.n_layers,
            n_kv_heads: config.n_head_kv,
            head_dim: config.head_dim,
            dtype_bytes,
            fp8: false,
        }
    }

    /// Bytes (FP8: elements are bytes) of one token's K, or V, in one layer.
    fn slot_len(&self) -> Option<u64> {
        if self.fp8 {
            return Some(kernels::kv_cache::slot_bytes(self.n_kv_heads, self.head_dim) as u64);
        }
        (self.n_kv_heads as u64).checked_mul(self.head_dim as u64)
    }

    /// Bytes of K and V of one token over all layers (`None` on overflow).
    pub fn bytes_per_token(&self) -> Option<u64> {
        let elem = if self.fp8 { 1 } else { self.dtype_bytes as u64 };
        [self.n_layers as u64, elem]
            .iter()
            .try_fold(self.slot_len()?.checked_mul(2)?, |acc, &x| acc.checked_mul(x))
    }
}

/// What the plan is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlanInputs {
    /// The KV cache's shape.
    pub kv: KvShape,
    /// Bytes of the model weights as loaded on the device.
    pub weight_bytes: u64,
    /// Bytes of the engine's other buffers at the largest step (activations,
    /// logits, sampling, attention partials).
    pub workspace_bytes: u64,
    /// Memory to plan with: the device's free memory **before** the weights
    /// are loaded (the driver's `cuMemGetInfo` free), or a CPU budget.
    pub available_bytes: u64,
    /// Memory left unplanned (driver and context growth, fragmentation).
    pub reserve_bytes: u64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Batch limit: sequences running at once.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt plus generated tokens).
    pub max_model_len: usize,
    /// An optional cap on the number of blocks (tests, a smaller cache on
    /// purpose).
    pub max_blocks: Option<usize>,
}

/// What decided the number of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLimit {
    /// The memory left after weights, workspace and reserve.
    Memory,
    /// The kernels' 32-bit offsets (a layer's cache below 2^31 elements).
    Offsets,
    /// [`MemoryPlanInputs::max_blocks`].
    Requested,
}

/// The computed plan; see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// What it was computed from.
    pub inputs: MemoryPlanInputs,
    /// KV bytes of one token (all layers, K and V).
    pub bytes_per_token: u64,
    /// KV bytes of one block.
    pub bytes_per_block: u64,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// What limited `num_blocks`.
    pub limit: BlockLimit,
    /// Bytes of the whole KV cache (`num_blocks * bytes_per_block`).
    pub kv_cache_bytes: u64,
    /// Blocks one sequence of `max_model_len` tokens needs.
    pub blocks_per_full_seq: usize,
    /// Sequences of `max_model_len` tokens the cache holds at once.
    pub full_context_seqs: usize,
    /// Sequences that can run at once even at full context, without
    /// preemption: `min(max_num_seqs, full_context_seqs)`. (Shorter sequences
    /// run up to `max_num_seqs` at once.)
    pub max_concurrent_seqs: usize,
}

/// The largest element count of one layer's cache (kernels use i32 offsets).
const MAX_CACHE_ELEMENTS: u64 = i32::MAX as u64;

impl MemoryPlan {
    /// Computes the plan. Errors ([`KvError::Config`], [`KvError::DoesNotFit`])
    /// say which input to change.
    pub fn new(inputs: MemoryPlanInputs) -> KvResult<MemoryPlan> {
        let kv = inputs.kv;
        if [kv.n_layers, kv.n_kv_heads, kv.head_dim, kv.dtype_bytes].contains(&0) {
            return Err(KvError::Config(format!("the KV cache shape {kv:?} has a zero dimension")));
        }
        if inputs.block_size == 0 || inputs.max_num_seqs == 0 || inputs.max_model_len == 0 {
            return Err(KvError::Config(
                "block_size, max_num_seqs and max_model_len must be positive".into(),
            ));
        }
        let overflow = || KvError::Config("the KV cache size overflows 64 bits".into());
        let bytes_per_token = kv.bytes_per_token().ok_or_else(overflow)?;
        let bytes_per_block = bytes_per_token.checked_mul(inputs.block_size as u64).ok_or_else(overflow)?;
        let fixed = [inputs.weight_bytes, inputs.workspace_bytes, inputs.reserve_bytes]
            .iter()
            .try_fold(0u64, |a, &b| a.checked_add(b))
            .ok_or_else(overflow)?;
        if fixed >= inputs.available_bytes {
            return Err(KvError::DoesNotFit(format!(
                "weights {} + workspace {} + reserve {} = {} leave nothing of the available {} for the KV cache",
                Bytes(inputs.weight_bytes),
                Bytes(inputs.workspace_bytes),
                Bytes(inputs.reserve_bytes),
                Bytes(fixed),
                Bytes(inputs.available_bytes)
            )));
        }
        let by_memory = (inputs.available_bytes - fixed) / bytes_per_block;
        let elements_per_block = kv.slot_len().ok_or_else(overflow)? * inputs.block_size as u64;
        let by_offsets = MAX_CACHE_ELEMENTS / elements_per_block;
        let mut num_blocks = by_memory;
        let mut limit = BlockLimit::Memory;
        if by_offsets < num_blocks {
            num_blocks = by_offsets;
            limit = BlockLimit::Offsets;
        }
        if let Some(cap) = inputs.max_blocks
            && (cap as u64) < num_blocks
        {
            num_blocks = cap as u64;
            limit = BlockLimit::Requested;
        }
        let num_blocks = usize::try_from(num_blocks).map_err(|_| overflow())?;
        let blocks_per_full_seq = blocks_for(inputs.max_model_len, inputs.block_size);
        if num_blocks < blocks_per_full_seq {
            let needed = blocks_per_full_seq as u64 * bytes_per_block;
            return Err(KvError::DoesNotFit(format!(
                "the KV cache gets {num_blocks} blocks ({} tokens, limited by {}) but one sequence of \
                 max_model_len = {} tokens needs {blocks_per_full_seq} blocks ({}); lower max_model_len to at \
                 most {} or free memory",
                num_blocks * inputs.block_size,
                limit,
                inputs.max_model_len,
                Bytes(needed),
                num_blocks * inputs.block_size
            )));
        }
        let full_context_seqs = num_blocks / blocks_per_full_seq;
        Ok(MemoryPlan {
            inputs,
            bytes_per_token,
            bytes_per_block,
            num_blocks,
            limit,
            kv_cache_bytes: num_blocks as u64 * bytes_per_block,
            blocks_per_full_seq,
            full_context_seqs,
            max_concurrent_seqs: full_context_seqs.min(inputs.max_num_seqs),
        })
    }

    /// Tokens the whole cache holds.
    pub fn kv_tokens(&self) -> usize {
        self.num_blocks * self.inputs.block_size
    }

    /// Bytes planned but left unused (the remainder of the last block, or
    /// what a cap left over).
    pub fn unused_bytes(&self) -> u64 {
        let i = &self.inputs;
        i.available_bytes - i.weight_bytes - i.workspace_bytes - i.reserve_bytes - self.kv_cache_bytes
    }

    /// The scheduler configuration this plan supports.
    pub fn scheduler_config(
        &self,
        max_num_batched_tokens: usize,
        enable_prefix_caching: bool,
    ) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens,
            max_num_seqs: self.inputs.max_num_seqs,
            max_model_len: self.inputs.max_model_len,
            num_blocks: self.num_blocks,
            block_size: self.inputs.block_size,
            enable_prefix_caching,
        }
    }
}

impl fmt::Display for BlockLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockLimit::Memory => "free memory",
            BlockLimit::Offsets => "32-bit cache offsets",
            BlockLimit::Requested => "the requested block cap",
        })
    }
}

/// A byte count printed with a binary unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 { write!(f, "{} B", self.0) } else { write!(f, "{value:.2} {}", UNITS[unit]) }
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inputs;
        let kv = &i.kv;
        writeln!(f, "memory plan:")?;
        writeln!(f, "  available    {:>12}", Bytes(i.available_bytes).to_string())?;
        writeln!(f, "  weights      {:>12}", Bytes(i.weight_bytes).to_string())?;
        writeln!(f, "  workspace    {:>12}", Bytes(i.workspace_bytes).to_string())?;
        writeln!(f, "  reserve      {:>12}", Bytes(i.reserve_bytes).to_string())?;
        let slot = if kv.fp8 {
            format!(
                "{} heads x ({} + 4 scale) B, FP8, padded to {} B",
                kv.n_kv_heads,
                kv.head_dim,
                kv.slot_len().unwrap_or(0)
            )
        } else {
            format!("{} heads x {} x {} B", kv.n_kv_heads, kv.head_dim, kv.dtype_bytes)
        };
        writeln!(
            f,
            "  KV cache     {:>12}  {} blocks x {} ({} tokens x {} layers x K,V x {slot})",
            Bytes(self.kv_cache_bytes).to_string(),
            self.num_blocks,
            Bytes(self.bytes_per_block),
            i.block_size,
            kv.n_layers,
        )?;
        writeln!(f, "  unused       {:>12}", Bytes(self.unused_bytes()).to_string())?;
        writeln!(f, "  blocks limited by {}", self.limit)?;
        writeln!(
            f,
            "  capacity     {} tokens ({} per token); {} sequences of max_model_len {}",
            self.kv_tokens(),
            Bytes(self.bytes_per_token),
            self.full_context_seqs,
            i.max_model_len
        )?;
        write!(
            f,
            "  concurrency  max_num_seqs {}; {} at full context without preemption",
            i.max_num_seqs, self.max_concurrent_seqs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// SmolLM2-135M's cache shape in bf16.
    fn smollm2() -> KvShape {
        KvShape { n_layers: 30, n_kv_heads: 3, head_dim: 64, dtype_bytes: 2, fp8: false }
    }

    fn inputs() -> MemoryPlanInputs {
        MemoryPlanInputs {
            kv: smollm2(),
            weight_bytes: 100 * MIB,
            workspace_bytes: GIB,
            available_bytes: 10 * GIB,
            reserve_bytes: 512 * MIB,
            block_size: 16,
            max_num_seqs: 64,
            max_model_len: 8192,
            max_blocks: None,
        }
    }

    #[test]
    fn smollm2_plan_arithmetic() {
        let plan = MemoryPlan::new(inputs()).unwrap();
        assert_eq!(plan.bytes_per_token, 2 * 30 * 3 * 64 * 2);
        assert_eq!(plan.bytes_per_block, 23040 * 16);
        let budget = 10 * GIB - 100 * MIB - GIB - 512 * MIB;
        assert_eq!(plan.num_blocks as u64, budget / (23040 * 16));
        assert_eq!(plan.limit, BlockLimit::Memory);
        assert_eq!(plan.blocks_per_full_seq, 512);
        assert_eq!(plan.full_context_seqs, plan.num_blocks / 512);
        assert_eq!(plan.max_concurrent_seqs, plan.full_context_seqs.min(64));
        assert!(plan.unused_bytes() < plan.bytes_per_block);
        let sc = plan.scheduler_config(2048, true);
        assert_eq!(sc.num_blocks, plan.num_blocks);
        sc.validate().unwrap();
        let text = plan.to_string();
        for needle in ["available", "10.00 GiB", "weights", "100.00 MiB", "KV cache", "360.00 KiB", "8192"] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
    }

    #[test]
    fn weights_that_do_not_fit_are_an_error() {
        let err = MemoryPlan::new(MemoryPlanInputs { weight_bytes: 10 * GIB, ..inputs() }).unwrap_err();
        assert!(matches!(err, KvError::DoesNotFit(_)), "{err}");
        assert!(err.to_string().contains("leave nothing"), "{err}");
    }

    #[test]
    fn a_cache_below_one_full_sequence_is_an_error() {
        // 2 GiB minus weights, workspace and reserve holds 1171 blocks; a
        // 1M-token context needs 65536.
        let plan = MemoryPlanInputs { available_bytes: 2 * GIB, max_model_len: 1 << 20, ..inputs() };
        let err = MemoryPlan::new(plan).unwrap_err();
        assert!(err.to_string().contains("lower max_model_len"), "{err}");
    }

    #[test]
    fn caps_by_offsets_and_request() {
        // 64 KV heads of 128: 2^31 / (16 * 8192) = 16383 blocks, far below
        // what a terabyte would hold.
        let big = KvShape { n_layers: 1, n_kv_heads: 64, head_dim: 128, dtype_bytes: 2, fp8: false };
        let plan =
            MemoryPlan::new(MemoryPlanInputs { kv: big, available_bytes: 1 << 40, ..inputs() }).unwrap();
        assert_eq!(plan.limit, BlockLimit::Offsets);
        assert_eq!(plan.num_blocks, 16383);
        assert!((plan.num_blocks * 16 * 64 * 128) as u64 <= i32::MAX as u64);
        let plan = MemoryPlan::new(MemoryPlanInputs { max_blocks: Some(600), ..inputs() }).unwrap();
        assert_eq!((plan.num_blocks, plan.limit), (600, BlockLimit::Requested));
        assert_eq!(plan.full_context_seqs, 1);
        assert_eq!(plan.max_concurrent_seqs, 1);
    }

    #[test]
    fn zero_inputs_are_config_errors() {
        let bad = MemoryPlanInputs { kv: KvShape { head_dim: 0, ..smollm2() }, ..inputs() };
        assert!(matches!(MemoryPlan::new(bad), Err(KvError::Config(_))));
        assert!(matches!(
            MemoryPlan::new(MemoryPlanInputs { block_size: 0, ..inputs() }),
            Err(KvError::Config(_))
        ));
    }

    #[test]
    fn bytes_display() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(3 * GIB).to_string(), "3.00 GiB");
    }
}
