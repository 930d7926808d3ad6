"""The validator: reads each batch's input file and reports every bad line, then a verdict."""
