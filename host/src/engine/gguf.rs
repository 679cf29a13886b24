//! GGUF model files: metadata access and tensor loading.
//!
//! A GGUF file holds the weights (quantised or not), the hyper-parameters under
//! `<architecture>.*` keys, the tokenizer under `tokenizer.ggml.*` and the chat template under
//! `tokenizer.chat_template`. The header is parsed once by candle's reader; tensors are read
//! one by one when the model is built, so peak memory is the model plus one tensor.
//!
//! A model file is untrusted input. candle's reader bounds every count and length by the file
//! size; on top of it, a reader panic (an alignment of zero) becomes an error, and every
//! tensor's element count and byte range is checked at open (no overflow, inside the file), so
//! a hostile header can neither abort the process nor make a later read allocate more than
//! the file holds. The model code then checks each tensor's shape against the
//! hyper-parameters before any kernel touches it ([`GgufFile::check_shape`]).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};

/// An opened GGUF file: its parsed header and a reader for its tensors.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl GgufFile {
    /// Opens `path` and parses its header (metadata and tensor directory).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open model file {}", path.display()))?;
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut reader = BufReader::new(file);
        let unreadable = |why: String| anyhow!("{} is not a readable GGUF file: {why}", path.display());
        let content = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Content::read(&mut reader)))
            .map_err(|_| unreadable("its header is malformed (the reader gave up)".into()))?
            .map_err(|e| unreadable(e.to_string()))?;
        for (name, info) in &content.tensor_infos {
            let elems = info.shape.dims().iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            let bytes = elems
                .filter(|n| n.is_multiple_of(info.ggml_dtype.block_size()))
                .and_then(|n| (n / info.ggml_dtype.block_size()).checked_mul(info.ggml_dtype.type_size()));
            let end = bytes.and_then(|b| content.tensor_data_offset.checked_add(info.offset)?.checked_add(b as u64));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(unreadable(format!(
                        "tensor `{name}` of shape {:?} ({:?}) does not fit in the file",
                        info.shape.dims(),
                        info.ggml_dtype
                    )));
                }
            }
        }
        Ok(Self { path: path.to_path_buf(), content, reader })
    }

    /// Fails unless tensor `name` has exactly the shape `dims` (rows first, as the model
    /// code indexes it): a file whose tensors disagree with its hyper-parameters is refused
    /// before a kernel could read past a buffer.
    pub fn check_shape(&self, name: &str, dims: &[usize]) -> anyhow::Result<()> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            bail!("{}: tensor `{name}` is missing", self.path.display());
        };
        if info.shape.dims() != dims {
            bail!(
                "{}: tensor `{name}` has shape {:?}; the model's hyper-parameters need {dims:?}",
                self.path.display(),
                info.shape.dims()
            );
        }
        Ok(())
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `general.architecture`, e.g. `llama` or `qwen2`.
    pub fn architecture(&self) -> anyhow::Result<&str> {
        self.string("general.architecture")
    }

    /// A metadata value, if present.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn required(&self, key: &str) -> anyhow::Result<&Value> {
        self.value(key).ok_or_else(|| anyhow!("{}: metadata key `{key}` is missing", self.path.display()))
    }

    /// A required unsigned integer (any integer width in the file).
    pub fn u32(&self, key: &str) -> anyhow::Result<u32> {
        let value = self.required(key)?;
        value_to_u64(value)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| anyhow!("{}: `{key}` is not an unsigned integer: {value:?}", self.path.display()))
    }

    /// An optional unsigned integer.
    pub fn opt_u32(&self, key: &str) -> anyhow::Result<Option<u32>> {
        if self.value(key).is_none() {
            return Ok(None);
        }
        self.u32(key).map(Some)
    }

    /// A required float.
    pub fn f32(&self, key: &str) -> anyhow::Result<f32> {
        let value = self.required(key)?;
        match value {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => value_to_u64(other)
                .map(|v| v as f32)
                .ok_or_else(|| anyhow!("{}: `{key}` is not a number: {value:?}", self.path.display())),
        }
    }

    /// An optional float.
    pub fn opt_f32(&self, key: &str) -> anyhow::Result<Option<f32>> {
        if self.value(key).is_none() {
            return Ok(None);
        }
        self.f32(key).map(Some)
    }

    /// A required string.
    pub fn string(&self, key: &str) -> anyhow::Result<&str> {
        match self.required(key)? {
            Value::String(s) => Ok(s),
            other => bail!("{}: `{key}` is not a string: {other:?}", self.path.display()),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Option<bool> {
        match self.value(key)? {
            Value::Bool(b) => Some(*b),
            other => value_to_u64(other).map(|v| v != 0),
        }
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> anyhow::Result<Vec<&str>> {
        let Value::Array(items) = self.required(key)? else {
            bail!("{}: `{key}` is not an array", self.path.display());
        };
        items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                other => bail!("{}: `{key}` holds a non-string {other:?}", self.path.display()),
            })
            .collect()
    }

    /// An optional array of integers.
    pub fn opt_integers(&self, key: &str) -> anyhow::Result<Option<Vec<i64>>> {
        let Some(value) = self.value(key) else { return Ok(None) };
        let Value::Array(items) = value else {
            bail!("{}: `{key}` is not an array", self.path.display());
        };
        items
            .iter()
            .map(|v| value_to_i64(v).ok_or_else(|| anyhow!("{}: `{key}` holds a non-integer", self.path.display())))
            .collect::<anyhow::Result<Vec<_>>>()
            .map(Some)
    }

    /// Whether the file has a tensor of that name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads one tensor into memory (CPU), in its stored (possibly quantised) format.
    pub fn tensor(&mut self, name: &str) -> anyhow::Result<QTensor> {
        if !self.has_tensor(name) {
            bail!("{}: tensor `{name}` is missing", self.path.display());
        }
        self.content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| anyhow!("{}: cannot read tensor `{name}`: {e}", self.path.display()))
    }
}

fn value_to_u64(value: &Value) -> Option<u64> {
    value_to_i64(value).and_then(|v| u64::try_from(v).ok())
}

fn value_to_i64(value: &Value) -> Option<i64> {
    Some(match value {
        Value::U8(v) => *v as i64,
        Value::I8(v) => *v as i64,
        Value::U16(v) => *v as i64,
        Value::I16(v) => *v as i64,
        Value::U32(v) => *v as i64,
        Value::I32(v) => *v as i64,
        Value::U64(v) => i64::try_from(*v).ok()?,
        Value::I64(v) => *v,
        _ => return None,
    })
}
