"""The train pool: submits, the scheduling loop that runs the policy's cycle, and how a stored job
is launched."""
