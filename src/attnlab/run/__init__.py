"""What a run keeps about itself: its record (JSON, environment, outcomes), the files of its directory, and the
summary it prints."""
