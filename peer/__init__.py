"""The volunteer peer client. Never imports coordinator/."""
