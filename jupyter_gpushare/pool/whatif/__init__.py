"""What-if replays of the recorded history, run in a worker process."""
