//! Hostile model files: a malformed header, tensors that overflow or run past the file,
//! hyper-parameters no model has, and tensors whose shapes disagree with them are each refused
//! with an error that names the file and the fault; none aborts the process or reaches a
//! kernel.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use dspark_host::engine::gguf::GgufFile;
use dspark_host::engine::{CpuBackend, Model};

const HIDDEN: usize = 64;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 128;
const VOCAB: usize = 32;

fn tensor(dims: &[usize]) -> QTensor {
    let t = Tensor::ones(dims, DType::F32, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

/// A one-block llama model; `edit` changes its metadata and tensors before it is written.
fn model_file(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>),
) -> PathBuf {
    let mut metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String("llama".into())),
        ("llama.embedding_length".into(), Value::U32(HIDDEN as u32)),
        ("llama.feed_forward_length".into(), Value::U32(FFN as u32)),
        ("llama.block_count".into(), Value::U32(1)),
        ("llama.attention.head_count".into(), Value::U32(HEADS as u32)),
        ("llama.attention.head_count_kv".into(), Value::U32(KV_HEADS as u32)),
        ("llama.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-5)),
        ("llama.context_length".into(), Value::U32(128)),
        ("llama.vocab_size".into(), Value::U32(VOCAB as u32)),
    ];
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), tensor(&[VOCAB, HIDDEN])),
        ("output_norm.weight".into(), tensor(&[HIDDEN])),
        ("blk.0.attn_q.weight".into(), tensor(&[q, HIDDEN])),
        ("blk.0.attn_k.weight".into(), tensor(&[kv, HIDDEN])),
        ("blk.0.attn_v.weight".into(), tensor(&[kv, HIDDEN])),
        ("blk.0.attn_output.weight".into(), tensor(&[HIDDEN, q])),
        ("blk.0.ffn_gate.weight".into(), tensor(&[FFN, HIDDEN])),
        ("blk.0.ffn_up.weight".into(), tensor(&[FFN, HIDDEN])),
        ("blk.0.ffn_down.weight".into(), tensor(&[HIDDEN, FFN])),
        ("blk.0.attn_norm.weight".into(), tensor(&[HIDDEN])),
        ("blk.0.ffn_norm.weight".into(), tensor(&[HIDDEN])),
    ];
    edit(&mut metadata, &mut tensors);
    let path = dir.join(name);
    let mut out = std::fs::File::create(&path).unwrap();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    path
}

fn set(metadata: &mut [(String, Value)], key: &str, value: Value) {
    metadata.iter_mut().find(|(k, _)| k == key).unwrap().1 = value;
}

fn load(path: &Path) -> anyhow::Result<()> {
    let mut file = GgufFile::open(path)?;
    Model::load(CpuBackend::new(), &mut file).map(drop)
}

fn refused(path: &Path) -> String {
    let e = load(path).err().unwrap_or_else(|| panic!("{} must be refused", path.display()));
    let text = format!("{e:#}");
    assert!(text.contains(&path.display().to_string()), "the error names the file: {text}");
    text
}

#[test]
fn hostile_model_files_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The well-formed file loads: the cases below differ from it in one thing each.
    load(&model_file(d, "good.gguf", |_, _| {})).expect("the baseline model loads");

    let e = refused(&model_file(d, "alignment.gguf", |m, _| m.push(("general.alignment".into(), Value::U32(0)))));
    assert!(e.ends_with("is not a readable GGUF file: its header is malformed (the reader gave up)"), "{e}");

    let e = refused(&model_file(d, "layers.gguf", |m, _| set(m, "llama.block_count", Value::U32(100_000))));
    assert!(e.ends_with("`block_count` is 100000; it must be from 1 to 1024"), "{e}");
    let e = refused(&model_file(d, "heads.gguf", |m, _| set(m, "llama.attention.head_count", Value::U32(0))));
    assert!(e.ends_with("`attention.head_count` is 0; it must be from 1 to 1024"), "{e}");
    let e = refused(&model_file(d, "context.gguf", |m, _| set(m, "llama.context_length", Value::U32(u32::MAX))));
    assert!(e.ends_with("`context_length` is 4294967295; it must be from 1 to 16777216"), "{e}");
    let e = refused(&model_file(d, "eps.gguf", |m, _| {
        set(m, "llama.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN))
    }));
    assert!(e.contains("rms epsilon NaN and rope base 10000 must be positive"), "{e}");

    let e = refused(&model_file(d, "shape.gguf", |_, t| t[2].1 = tensor(&[HEAD_DIM, HIDDEN])));
    assert!(
        e.ends_with("tensor `blk.0.attn_q.weight` has shape [32, 64]; the model's hyper-parameters need [64, 64]"),
        "{e}"
    );
    let e = refused(&model_file(d, "vocab.gguf", |m, _| set(m, "llama.vocab_size", Value::U32(1000))));
    assert!(
        e.ends_with("tensor `token_embd.weight` has shape [32, 64]; the model's hyper-parameters need [1000, 64]"),
        "{e}"
    );

    // A file cut short: the last tensor runs past its end.
    let good = std::fs::read(d.join("good.gguf")).unwrap();
    let cut = d.join("cut.gguf");
    std::fs::write(&cut, &good[..good.len() - 100]).unwrap();
    let e = refused(&cut);
    assert!(e.contains("does not fit in the file"), "{e}");

    // Not a model at all, and a header that claims more than the file holds.
    let garbage = d.join("garbage.gguf");
    std::fs::write(&garbage, b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f\xff\xff\xff\xff\xff\xff\xff\x7f")
        .unwrap();
    let e = refused(&garbage);
    assert!(e.contains("is not a readable GGUF file"), "{e}");
    let text = d.join("text.gguf");
    std::fs::write(&text, "not a model").unwrap();
    assert!(refused(&text).contains("is not a readable GGUF file"));
}
