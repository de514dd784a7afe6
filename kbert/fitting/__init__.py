"""What every training run stands on: optimizers and schedules, `tf.distribute`, checkpoints to resume from.

Pretraining (`kbert.pretraining`) and fine-tuning (`kbert.training`) both fit
with these; neither is imported here.
"""
