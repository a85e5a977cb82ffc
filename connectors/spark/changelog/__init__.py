"""FROM_CHANGELOG / TO_CHANGELOG on DataFrames and as Spark SQL table functions."""
