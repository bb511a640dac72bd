package txjoin.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a process per file. Without Hadoop's native library (pip's
 * pyspark has none) RawLocalFileSystem sets the permission of every file and directory it
 * creates by starting {@code chmod}, and tells whether a path is a symbolic link by starting
 * {@code readlink}: about fifty processes per micro-batch (checkpoint and state files, Delta's
 * log). This does both in Java, with the same outcome; anything else is Hadoop's own.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    int mode = permission.toShort();
    if ((mode & ~0777) != 0) {  // the sticky bit: only chmod sets it
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        set.add(BITS[bit]);
      }
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    // Hadoop's answer for a path that is not a link (readlink printing nothing) is its status.
    if (!Files.isSymbolicLink(pathToFile(f).toPath())) {
      return getFileStatus(f);
    }
    return super.getFileLinkStatus(f);
  }
}
