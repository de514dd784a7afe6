"""A question-answering `.tflite` for the TFLite Task Library's `BertQuestionAnswerer`.

`kbert export` writes it for the `question-answering` task, as its
`mediapipe` format (MediaPipe itself has no question-answering task), into
`OUT/mediapipe/bert_question_answerer.tflite`, and runs it with
`tflite_support.task.text.BertQuestionAnswerer` (tflite-support 0.4.4, in
an environment of its own: `kbert.export.mediapipe_env`). What the runtime
relies on (`bert_question_answerer.cc`), and what `contract_problems` tests:

| point | why |
| --- | --- |
| three int32 inputs `[1, 384]` whose metadata names are `ids`, `mask`, `segment_ids` | it finds them by these names and fills 384 positions, whatever the model's length |
| two float32 outputs `[1, 384]` named `start_logits` and `end_logits` in the metadata | it finds them by these names |
| a BertTokenizer input process unit, the vocabulary packed, `[PAD]` first | it tokenizes with it and pads with id 0 |

No metadata writer for question answering exists in tflite-support or
MediaPipe; MediaPipe's generic `MetadataWriter` (a BERT text input and two
feature outputs) writes what the runtime reads.

The runtime answers its own way, unlike run_squad.py and `kbert predict`:
it lower-cases ASCII only (no accent stripping), splits the context on
spaces alone (a Chinese context is one word), keeps the first window alone
(no doc stride), cuts the question at 64 pieces, takes the top 5 starts
times the top 5 ends with answers of at most 32 pieces, has no max-context
or null answer, and answers whole space-separated words. So its answers are
held to those rules, not to kbert's: on questions and contexts in ASCII, its
inputs are kbert's first window at length 384, and its best answer must be
the pair its rules pick from the Keras model's logits there
(`emulation`); its logits are the Keras model's within `kbert.export.serving_base.FLOAT_TOLERANCE`
(the LiteRT interpreter on the same file). Its EM/F1, against the gold
answers and against `kbert predict`'s, are reported as they come.
"""

import os
import tempfile

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from kbert.config import ENCODER_INPUTS
from kbert.export import mediapipe, mediapipe_contract, mediapipe_env, tflite
from kbert.tasks import squad_eval

FILE = "bert_question_answerer.tflite"
# bert_question_answerer.cc's kMaxSeqLen, kMaxQueryLen, kPredictAnsNum, kMaxAnsLen.
SEQUENCE_LENGTH = 384
MAX_QUERY_LENGTH = 64
TOP_CANDIDATES = 5
MAX_ANSWER_LENGTH = 32
RUNTIME = "task_library BertQuestionAnswerer"
OUTPUT_NAMES = ("start_logits", "end_logits")


def export_bert_question_answerer(folder, out, examples, reference, cache_dir=None):
    """Writes `out/bert_question_answerer.tflite` and runs it on `examples`.

    Args:
        folder: `kbert.modelfolder.ModelFolder` of a question-answering model.
        out: str. A new folder.
        examples: the task's examples.
        reference: dict. The float32 Keras model's outputs on `examples`
            (`kbert predict`'s answers, which the runtime's are compared with;
            its own inputs are 384 long whatever the model's length, and the
            Keras model is run on them here).
        cache_dir: str. Where the tools' environments live.

    Returns:
        list of one report entry: `path`, `format`, `quantization`, `input`,
        `runtime`, `max_abs_diff`, `predictions`, `outputs` (the file's logits
        on each question's first window), `latency`, `contract`, `emulation`,
        `agreement_with_kbert_predict`.
    """
    task = folder.task
    if folder.config.max_position_embeddings < SEQUENCE_LENGTH:
        raise ValueError(
            f"BertQuestionAnswerer feeds {SEQUENCE_LENGTH} positions; the model has "
            f"max_position_embeddings={folder.config.max_position_embeddings}"
        )
    mediapipe_contract.check_vocabulary(folder.vocabulary)
    os.makedirs(out)
    mediapipe_env.ensure_environments([mediapipe_env.MEDIAPIPE, mediapipe_env.TFLITE_SUPPORT], cache_dir)
    path = os.path.join(out, FILE)
    runtime_task = type(task)(
        folder.tokenizer, SEQUENCE_LENGTH, **{**task.settings(), "max_query_length": MAX_QUERY_LENGTH}
    )
    contract = write_question_answerer(folder.model, runtime_task, folder.vocabulary, path, cache_dir)

    # The runtime's inputs where they are kbert's: the first window at 384.
    encoded = runtime_task.encode(examples, targets=False)
    first = np.flatnonzero(encoded.extra["windows"] == 0)
    features = {name: encoded.features[name][first] for name in ENCODER_INPUTS}
    keras_logits = runtime_task.run(folder.float32_model(), features)
    file_logits = _interpreter_logits(path, features)
    reply = mediapipe_env.run_worker(
        mediapipe_env.TFLITE_SUPPORT,
        "answer_task_library",
        {
            "model": os.path.abspath(path),
            "questions": [e.question for e in examples],
            "contexts": [e.context for e in examples],
        },
        cache_dir,
    )
    questions = encoded.extra["questions"]
    emulated = [
        emulate_answers(keras_logits["start_logits"][i], keras_logits["end_logits"][i],
                        len(q.query) + 2, q.windows[0][1])
        for i, q in enumerate(questions)
    ]
    predictions = [_prediction(answers) for answers in reply["answers"]]
    kbert_answers = [
        task.answer(p)["text"] for p in task.decode(examples, task.encode(examples, targets=False), reference)
    ]
    return [{
        "path": path,
        "format": "mediapipe",
        "quantization": "none",
        "input": "text",
        "runtime": RUNTIME,
        "max_abs_diff": float(max(np.abs(file_logits[n] - keras_logits[n]).max() for n in OUTPUT_NAMES)),
        "predictions": predictions,
        "outputs": file_logits,
        "latency": {"median_ms": round(float(np.median(reply["times"])) * 1e3, 3), "runs": len(reply["times"])},
        "contract": contract,
        "emulation": emulation_agreement(examples, reply["answers"], emulated),
        "agreement_with_kbert_predict": {
            k: v for k, v in squad_eval.squad_v2_metrics(
                [[text] if text else [] for text in kbert_answers], [p["answer"]["text"] for p in predictions]
            ).items() if k in ("exact_match", "f1")
        },
    }]


def write_question_answerer(model, task, vocabulary, path, cache_dir=None):
    """Converts `model` at length 384 and writes it to `path` with the runtime's metadata.

    Returns:
        dict. The file's contract as read back (`mediapipe_contract.read_contract`);
        `ValueError` listing every broken point of the module's table.
    """
    with tempfile.TemporaryDirectory(prefix="kbert-qa-") as tmp:
        source = os.path.join(tmp, "source")
        tflite.write_token_source(task, model, SEQUENCE_LENGTH, source)
        content = tflite.convert_tokens(source, "none")
    mediapipe.write_bert_features(
        content, vocabulary, _output_order(content), path, cache_dir,
        name="kbert question answering",
        description="Extractive question answering (SQuAD): start and end logits per position.",
    )
    contract = mediapipe_contract.read_contract(path, cache_dir)
    problems = contract_problems(contract, vocabulary)
    if problems:
        raise ValueError(f"{path} breaks BertQuestionAnswerer's contract:\n- " + "\n- ".join(problems))
    return {
        "inputs": [{k: t[k] for k in ("signature_name", "metadata_name", "dtype", "shape")} for t in contract["inputs"]],
        "outputs": [{k: t[k] for k in ("signature_name", "metadata_name", "dtype", "shape")} for t in contract["outputs"]],
        "associated_files": contract["associated_files"],
    }


def contract_problems(contract, vocabulary):
    """What in `contract` (`mediapipe_contract.read_contract`'s) breaks the module's table; list of str."""
    problems = []
    if contract["subgraphs"] != 1:
        problems.append(f"{contract['subgraphs']} subgraphs; expected 1")
    shape = [1, SEQUENCE_LENGTH]
    for side, expected, dtype in (
        ("inputs", mediapipe_contract.METADATA_INPUT_NAMES, "int32"),
        ("outputs", {name: name for name in OUTPUT_NAMES}, "float32"),
    ):
        tensors = contract[side]
        if sorted(str(t["signature_name"]) for t in tensors) != sorted(expected):
            problems.append(f"{side} {[t['signature_name'] for t in tensors]}; expected {sorted(expected)}")
        for tensor in tensors:
            name = tensor["signature_name"]
            if tensor["metadata_name"] != expected.get(name):
                problems.append(
                    f"{name!r} is named {tensor['metadata_name']!r} in the metadata; expected {expected.get(name)!r}"
                )
            if tensor["dtype"] != dtype or tensor["shape"] != shape or tensor["shape_signature"] != shape:
                problems.append(f"{name!r} is {tensor['dtype']} {tensor['shape_signature']}; expected {dtype} {shape}")
    if contract["tokenizer"] != "BertTokenizerOptions":
        problems.append(f"input process unit {contract['tokenizer']!r}; expected BertTokenizerOptions")
    if contract["vocabulary"] != list(vocabulary):
        problems.append("the packed vocabulary differs from the model's")
    return problems


def emulate_answers(start_logits, end_logits, offset, length):
    """BertQuestionAnswerer's `Postprocess` on one window's logits.

    The top `TOP_CANDIDATES` starts times ends, both in the context's
    `length` pieces from `offset`, end not before start, at most
    `MAX_ANSWER_LENGTH` pieces; best first by the float32 sum of logits.

    Returns:
        list of `(start, end, logit)`.
    """
    start_logits = np.asarray(start_logits, np.float32)
    end_logits = np.asarray(end_logits, np.float32)
    starts = np.argsort(-start_logits, kind="stable")[:TOP_CANDIDATES]
    ends = np.argsort(-end_logits, kind="stable")[:TOP_CANDIDATES]
    found = [
        (int(s), int(e), float(start_logits[s] + end_logits[e]))
        for s in starts for e in ends
        if offset <= s < offset + length and offset <= e < offset + length and s <= e < s + MAX_ANSWER_LENGTH
    ]
    return sorted(found, key=lambda answer: -answer[2])[:TOP_CANDIDATES]


def emulation_agreement(examples, answers, emulated):
    """How the runtime's best answers agree with its rules applied to the Keras logits,
    on the questions whose question and context are ASCII (where its inputs are kbert's)."""
    ascii_only = [e.question.isascii() and e.context.isascii() for e in examples]
    same, diffs = [], [0.0]
    for is_ascii, got, expected in zip(ascii_only, answers, emulated):
        if not is_ascii:
            continue
        top = (got[0]["start"], got[0]["end"]) if got else None
        same.append(top == (expected[0][:2] if expected else None))
        if got and expected:
            diffs.append(abs(got[0]["logit"] - expected[0][2]))
    return {
        "ascii_questions": len(same),
        "top_answer_agreement": float(np.mean(same)) if same else None,
        "max_abs_logit_diff": float(max(diffs)),
    }


def _prediction(answers):
    """A prediction (`QuestionAnswering.decode`'s form) from the runtime's answers."""
    if not answers:
        return {"answer": {"text": "", "start": None, "end": None, "score": None}, "best_score": None,
                "null_score_diff": None}
    top = answers[0]
    return {
        "answer": {"text": top["text"], "start": None, "end": None, "score": top["logit"]},
        "best_score": None,
        "null_score_diff": None,
    }


def _output_order(content):
    """The signature names of the model's outputs, in the subgraph's order."""
    interpreter = Interpreter(model_content=content)
    by_index = {d["index"]: name for name, d in interpreter.get_signature_runner().get_output_details().items()}
    return [by_index[d["index"]] for d in interpreter.get_output_details()]


def _interpreter_logits(path, features):
    runner = tflite.TfliteRunner(path, threads=1)
    outputs = runner.run(features)
    return {name: np.asarray(outputs[name], np.float32) for name in OUTPUT_NAMES}
