"""The lab's pure vocabulary: names, limits and the Lab namespace. Imports nothing of the project."""
