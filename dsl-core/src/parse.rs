//! Parser of the IR text format (the printer's output).
