"""`TaskConfig`: every setting of a task, declared once.

A task's `Config` is a frozen dataclass. Each field is made by `option` (a
flag of `kbert finetune`, `evaluate`, `predict` and `export`, and a keyword of
`kbert.TaskModel.from_checkpoint`) or by `learned` (what the training data
teaches: label names, tags, a score range). From that one declaration:

- `Task.options` lists the flags (`kbert.cliargs.add_task_options` adds them);
- values given as strings on the command line are parsed by the field's type
  (int, float, bool, str) and checked against its choices;
- `kbert.json` stores `to_dict()`, every field once, as `task_settings`;
- the trainer, the model folder and the exporter merge given flags into a
  model's stored config with `merged`, the one merge there is.

Example:
>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Config(TaskConfig):
...     labels: list = learned("class names, in output order", required=True)
...     text_column: str = option("column holding the text", "text")
>>> Config.create({"labels": ["a", "b"]}).text_column
'text'
"""

import dataclasses
import math

from kbert.tasks.records import Option

# What a bool flag may be given as on the command line.
BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def option(help, default=None, choices=None, *, former=dataclasses.MISSING, built=False, tuned=False):
    """A field that a flag sets.

    Args:
        help: str. The flag's help (`--name-with-dashes`).
        default: the value a new model takes (and the flag's default).
        choices: tuple or None. The values it may take.
        former: the value of a model folder written before the field existed
            (default: `default`).
        built: bool. It shapes the model (a head): a trained model refuses
            another value.
        tuned: bool. Unless given, `Task.tune` chooses it on the model's dev
            predictions (default None: not chosen yet); another model (a
            distilled student) chooses it again (`TaskConfig.untuned`).
    """
    metadata = {"help": help, "choices": choices, "flag": True, "built": built, "tuned": tuned,
                "former": default if former is dataclasses.MISSING else former}
    return dataclasses.field(default=default, metadata=metadata)


def learned(help, default=None, required=False):
    """A field that the training data gives (`Task.learn`), not a flag; a `required`
    one must be given to build the task."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": False, "required": required})


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The settings of a task that has none; each task's `Config` adds its fields."""

    @classmethod
    def flags(cls):
        """The `Option`s of the fields a flag sets, in declaration order."""
        return tuple(
            Option(f.name, f.metadata["help"], f.default, f.metadata["choices"])
            for f in dataclasses.fields(cls) if f.metadata.get("flag")
        )

    @classmethod
    def create(cls, values, owner="the task"):
        """The config of `values` (name -> value; strings parsed); other fields take
        their defaults. `ValueError` naming a field `owner` does not take."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"{owner} takes no {unknown[0]}=; it takes {', '.join(fields) or 'no settings'}")
        missing = [name for name, f in fields.items() if f.metadata.get("required") and values.get(name) is None]
        if missing:
            raise ValueError(f"{owner} needs {', '.join(name + '=' for name in missing)}")
        return cls(**{name: _parse(fields[name], value) for name, value in values.items()})

    @classmethod
    def with_formers(cls, values):
        """A model folder's stored `values`, where a flag they lack (the folder was
        written before the field existed) takes its `former` value."""
        formers = {f.name: f.metadata["former"] for f in dataclasses.fields(cls)
                   if f.metadata.get("flag") and f.name not in values}
        return {**formers, **values}

    def merged(self, given, trained):
        """This config with the flags `given` (name -> value or None: not given).

        Names that are not flags of this config are ignored (a command's
        flags serve several tasks). A `built` flag of a `trained` model
        refuses another value than its own.
        """
        fields = {f.name: f for f in dataclasses.fields(self) if f.metadata.get("flag")}
        changes = {}
        for name, value in (given or {}).items():
            if value is None or name not in fields:
                continue
            value = _parse(fields[name], value)
            if fields[name].metadata["built"] and trained and value != getattr(self, name):
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{flag} {value!r}: this model has {name} {getattr(self, name)!r}; "
                    f"it is chosen when training (kbert finetune {flag})"
                )
            changes[name] = value
        return dataclasses.replace(self, **changes)

    def untuned(self, given):
        """This config with its `tuned` flags unset (None: `Task.tune` chooses them
        again), but those `given` (name -> value or None: not given)."""
        kept = {name for name, value in (given or {}).items() if value is not None}
        return dataclasses.replace(self, **{
            f.name: None for f in dataclasses.fields(self) if f.metadata.get("tuned") and f.name not in kept
        })

    def to_dict(self):
        """Every field by name: what `kbert.json` stores (JSON values)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class ConfigFields:
    """Reads and writes the fields of `self.config` as attributes: one place holds each."""

    def __getattr__(self, name):
        config = self.__dict__.get("config")
        if config is not None and name in config.__dataclass_fields__:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        config = self.__dict__.get("config")
        if config is not None and name in config.__dataclass_fields__:
            self.config = dataclasses.replace(config, **{name: value})
        else:
            super().__setattr__(name, value)


def _parse(field, value):
    """`value` as `field`'s type (a command line gives strings), checked against its choices."""
    name, kind = field.name, field.type
    if value is None:
        return None
    if isinstance(value, str) and kind in (int, float, bool):
        text = value.strip().lower()
        try:
            value = BOOLEANS[text] if kind is bool else kind(text)
        except (KeyError, ValueError):
            expected = "true or false" if kind is bool else f"{'an integer' if kind is int else 'a number'}"
            raise ValueError(f"{name}={value!r}; expected {expected}") from None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name}={value!r}; expected an integer")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name}={value!r}; expected a finite number")
        value = float(value)
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}; expected true or false")
    choices = field.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"{name}={value!r}; expected one of {', '.join(map(str, choices))}")
    return value
