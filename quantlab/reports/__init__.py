"""What a run's records read as for people and CI: the Markdown/HTML/JUnit reports and
the plots. Reads results; no check or release stage imports it."""
