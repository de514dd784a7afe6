"""One `gpu_train.py` job on Hugging Face transformers + PyTorch: bfloat16 autocast,
SDPA attention, `torch.compile`, fused AdamW (on CUDA).

Models are built from a config (random init, no download): `BertForPreTraining`
and `BertForSequenceClassification`. The pretraining loss applies
`BertForPreTraining`'s own heads (`cls.predictions`, `cls.seq_relationship`) to
the masked positions only, as google-research/bert and kbert do; its
`forward` would project all positions onto the vocabulary, work that the shared
FLOP count (and kbert) does not do.

    python tools/benchmarks/gpu_torch.py '{"kind": "pretrain", ...}'
"""

import os
import sys

# kbert's config helpers import Keras; keep its backend (JAX) off the GPU here,
# so that it takes none of the memory PyTorch is measured on.
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ["JAX_PLATFORMS"] = "cpu"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_common  # noqa: E402

from kbert.checkpoints.huggingface import config_to_hf  # noqa: E402
from kbert.config import BertConfig  # noqa: E402


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul(settings):
    size, products = settings["size"], settings["products"]
    generator = torch.Generator(device()).manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator, device=device(), dtype=torch.bfloat16)
            for _ in range(2))
    # Scaled so that a chain of products keeps its magnitude, as on the JAX side.
    b *= size**-0.5

    def chain():
        out = a
        for _ in range(products):
            out = out @ b
        sync()

    return {"tflops": gpu_common.matmul_tflops(chain, size, products, settings["repeats"])}


def build(job):
    hf_config = transformers.BertConfig(
        **config_to_hf(BertConfig.from_dict(job["config"])),
        num_labels=job.get("num_classes", 2),
        attn_implementation="sdpa",
    )
    if job["kind"] == "pretrain":
        model = transformers.BertForPreTraining(hf_config)
    else:
        model = transformers.BertForSequenceClassification(hf_config)
    return model.to(device()).train()


def pretraining_loss(model, batch):
    sequence, pooled = model.bert(
        input_ids=batch["token_ids"], token_type_ids=batch["segment_ids"],
        attention_mask=batch["padding_mask"], return_dict=False,
    )[:2]
    positions = batch["masked_lm_positions"].long()
    gathered = torch.gather(sequence, 1, positions[..., None].expand(-1, -1, sequence.shape[-1]))
    logits = model.cls.predictions(gathered).float()
    weights = batch["masked_lm_weights"].flatten()
    masked_lm = F.cross_entropy(
        logits.flatten(0, 1), batch["masked_lm_ids"].long().flatten(), reduction="none"
    )
    next_sentence = F.cross_entropy(
        model.cls.seq_relationship(pooled).float(), batch["next_sentence"].long()
    )
    # As kbert's losses: the mean over real predictions, plus the next-sentence mean.
    return (masked_lm * weights).sum() / weights.sum() + next_sentence


def classification_loss(model, batch):
    logits = model(
        input_ids=batch["token_ids"], token_type_ids=batch["segment_ids"],
        attention_mask=batch["padding_mask"],
    ).logits
    return F.cross_entropy(logits.float(), batch["labels"].long())


def peak_memory():
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(), "device"
    return gpu_common.host_peak_bytes(), "host_rss"


def train(job):
    torch.manual_seed(job["seed"])
    model = build(job)
    loss_fn = pretraining_loss if job["kind"] == "pretrain" else classification_loss
    if job["compile"]:
        loss_fn = torch.compile(loss_fn, dynamic=False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=job["lr"], weight_decay=job["weight_decay"], eps=job["epsilon"],
        fused=torch.cuda.is_available() or None,
    )
    batches = gpu_common.load_batches(
        job["data"], job["part"], job["batch_size"], job["warmup_steps"] + job["steps"]
    )
    autocast = torch.autocast(device().type, dtype=torch.bfloat16, enabled=job["bf16"])

    def step(batch):
        batch = {name: torch.from_numpy(value).to(device(), non_blocking=True)
                 for name, value in batch.items()}
        with autocast:
            loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result = gpu_common.timed_training(step, batches, job["warmup_steps"])
    result["peak_memory_bytes"], result["peak_memory_kind"] = peak_memory()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    return result


def main():
    job = gpu_common.read_job()
    result = train(job)
    if "matmul" in job:
        # After training, so its buffers are not in the training's peak memory.
        result["matmul"] = matmul(job["matmul"])
    result.update({
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    })
    gpu_common.report(result)


if __name__ == "__main__":
    main()
