#!/usr/bin/env python3
"""Writes fuzz/corpus/gguf/tiny-llama.gguf: the smallest well-formed llama GGUF that dspark
loads (one block, hidden size 8, a byte-level BPE tokenizer of 8 tokens), the seed the gguf
fuzz target mutates."""
import struct, sys, os

U32, F32, STRING, ARRAY, I32 = 4, 6, 8, 9, 5

def s(text):
    b = text.encode()
    return struct.pack('<Q', len(b)) + b

def kv(key, vtype, payload):
    return s(key) + struct.pack('<I', vtype) + payload

def strings(items):
    return struct.pack('<IQ', STRING, len(items)) + b''.join(s(i) for i in items)

hidden, heads, kv_heads, ffn, vocab = 8, 2, 1, 16, 8
head_dim = hidden // heads
tokens = ['a', 'b', 'c', 'ab', 'Ġ', 'Ġa', '<s>', '</s>']
meta = [
    kv('general.architecture', STRING, s('llama')),
    kv('llama.embedding_length', U32, struct.pack('<I', hidden)),
    kv('llama.feed_forward_length', U32, struct.pack('<I', ffn)),
    kv('llama.block_count', U32, struct.pack('<I', 1)),
    kv('llama.attention.head_count', U32, struct.pack('<I', heads)),
    kv('llama.attention.head_count_kv', U32, struct.pack('<I', kv_heads)),
    kv('llama.attention.layer_norm_rms_epsilon', F32, struct.pack('<f', 1e-5)),
    kv('llama.context_length', U32, struct.pack('<I', 64)),
    kv('tokenizer.ggml.model', STRING, s('gpt2')),
    kv('tokenizer.ggml.tokens', ARRAY, strings(tokens)),
    kv('tokenizer.ggml.merges', ARRAY, strings(['a b', 'Ġ a'])),
    kv('tokenizer.ggml.token_type', ARRAY, struct.pack('<IQ', I32, vocab) + struct.pack('<8i', 1, 1, 1, 1, 1, 1, 3, 3)),
    kv('tokenizer.ggml.bos_token_id', U32, struct.pack('<I', 6)),
    kv('tokenizer.ggml.eos_token_id', U32, struct.pack('<I', 7)),
]
q, kvd = heads * head_dim, kv_heads * head_dim
# (name, rows, cols): GGUF lists the innermost (column) dimension first.
tensors = [('token_embd.weight', vocab, hidden), ('output_norm.weight', None, hidden),
           ('blk.0.attn_q.weight', q, hidden), ('blk.0.attn_k.weight', kvd, hidden),
           ('blk.0.attn_v.weight', kvd, hidden), ('blk.0.attn_output.weight', hidden, q),
           ('blk.0.ffn_gate.weight', ffn, hidden), ('blk.0.ffn_up.weight', ffn, hidden),
           ('blk.0.ffn_down.weight', hidden, ffn), ('blk.0.attn_norm.weight', None, hidden),
           ('blk.0.ffn_norm.weight', None, hidden)]
infos, data = b'', b''
for name, rows, cols in tensors:
    dims = [cols] if rows is None else [cols, rows]
    n = cols * (rows or 1)
    infos += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
    infos += struct.pack('<IQ', 0, len(data))
    data += struct.pack(f'<{n}f', *[0.01 * (i % 7) for i in range(n)])
    data += b'\0' * (-len(data) % 32)
head = struct.pack('<IIQQ', 0x46554747, 3, len(tensors), len(meta)) + b''.join(meta) + infos
head += b'\0' * (-len(head) % 32)
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'corpus/gguf/tiny-llama.gguf')
open(out, 'wb').write(head + data)
print(out, len(head + data), 'bytes')
