"""The rotary family. Importing this package registers its encodings."""
