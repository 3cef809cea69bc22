"""The relative family. Importing this package registers its encodings."""
